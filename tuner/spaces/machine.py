"""The machine a CPU schedule is configured for: its vector registers, caches and cores, read from the
target and the OS (what its kernels were measured to reach is ``calibration``'s).

These are the static facts of AutoConfig's analytic model (``analytic``): the register tile is sized
from the registers, the reduction block from L1, the blocks a parallel task works through from L2, the
parallel split from the cores.
"""

from __future__ import annotations

from dataclasses import dataclass

import tvm

from common.host import data_caches

from .register_tiles import RegisterFile, register_file


@dataclass(frozen=True)
class MachineFacts:
    registers: RegisterFile  # fp32 lanes and vector registers
    cores: int  # the kernels' threads: the target's num-cores
    l1_bytes: int  # data cache of one core
    l2_bytes: int  # of one core (its share, where a core's L2 is shared)
    l3_bytes: int  # the share of one of ``cores``

    @classmethod
    def of(cls, target: tvm.target.Target) -> MachineFacts | None:
        """The facts of an llvm target whose CPU has FMA (this host's caches); None for other targets."""
        registers = register_file(target)
        if registers is None:
            return None
        cores = int(target.attrs.get("num-cores", 1)) or 1
        by_level = {cache.level: cache for cache in data_caches()}
        l1 = by_level.get(1)
        l2 = by_level.get(2, l1)
        l3 = by_level.get(3, l2)

        def per_core(cache) -> int:
            return cache.bytes // max(1, min(cache.shared_by, cores))

        return cls(registers, cores, per_core(l1), per_core(l2), per_core(l3))

    def describe(self) -> str:
        return (
            f"{self.cores} cores, {self.registers.registers} vector registers of {self.registers.lanes} fp32 lanes, "
            f"L1d {self.l1_bytes >> 10} KiB, L2 {self.l2_bytes >> 10} KiB, L3 {self.l3_bytes >> 20} MiB per core"
        )
