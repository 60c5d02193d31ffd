"""Fresh samples of MetaSchedule's CPU tiling drawn where a tile's accumulators fill the registers.

MetaSchedule's CPU design space ("SSRSRS" multi-level tiling) draws every loop's tile factors at
random. The innermost spatial factors are the register tile: the accumulators the FMAs add into
(its last loop vectorised); the innermost reduction factors are the steps the tile runs between
loading its accumulators and storing them back. A core with two 512-bit FMA ports (Intel's from
Skylake-SP on) needs about 16 accumulators to keep both busy (two ports, four cycles' latency) and
a long inner reduction to keep the loads and stores of them rare. Few random draws are such: 2.5%
of a 128x3072x768 product's, and its 32 trials found none (best: 8 accumulators over 12 steps,
78% of the FMA peak; 16 over 32-64 ran 10-17% faster on the Intel VM). ``TileDraw`` draws the
innermost factors from that region (the rest of each loop's extent split at random over the outer
levels, as MetaSchedule does) and lets MetaSchedule draw everything else; the search takes a share
of its fresh samples this way and the rest as MetaSchedule draws them. Where a kernel's loops allow
no such tile (197 tokens have no divisor but 1 and 197: one-row tiles of at most 4 vectors), its
samples are MetaSchedule's own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm.target import codegen

VECTOR_LANES = 16  # fp32 lanes of AVX-512; our own rules vectorise channels by it
CPU_TILING = "SSRSRS"  # MetaSchedule's multi-level tiling structure on CPUs
TILING_ANNOTATION = "meta_schedule.tiling_structure"
UNROLL_ANNOTATION = "meta_schedule.unroll_explicit"
MIN_INNER_REDUCTION = 32  # steps between a tile's loads and stores of its accumulators, where the loop allows
DISABLE_ENV = "TENSOR_TUNER_REGISTER_TILES"  # "0": every fresh sample as MetaSchedule draws it, to compare


@dataclass(frozen=True)
class RegisterFile:
    lanes: int  # fp32 lanes of a vector register
    registers: int

    @property
    def min_accumulators(self) -> int:
        return self.registers // 4  # two FMA ports x four cycles' latency on AVX-512

    @property
    def enough_accumulators(self) -> int:
        """Accumulators past which a tile's loads, not the FMA latency, decide its speed: the minimum and half
        again, for the loads and stores between the FMAs."""
        return self.min_accumulators * 3 // 2

    @property
    def max_accumulators(self) -> int:
        return self.registers * 3 // 4  # the rest hold a step's weight vectors and broadcasts

    def fits(self, accumulators: int, vectors: int) -> bool:
        """Whether a tile of ``accumulators`` leaves registers for a step's ``vectors`` weight vectors and
        one broadcast: on AVX2's 16, a 3x4 tile (12 + 4 + 1) spills and runs at 60% of a 6x2 one."""
        return accumulators + vectors + 1 <= self.registers

    def holds(self, accumulators: int, vectors: int) -> bool:
        """``fits``, within ``max_accumulators``: the bound of the tiles drawn at random."""
        return accumulators <= self.max_accumulators and self.fits(accumulators, vectors)


def register_file(target: tvm.target.Target) -> RegisterFile | None:
    """The vector registers of an llvm target's CPU that fresh samples' tiles are drawn to fill; None for
    other targets, CPUs without FMA, and where ``DISABLE_ENV`` is "0"."""
    if target.kind.name != "llvm" or os.environ.get(DISABLE_ENV) == "0":
        return None
    if codegen.target_has_features("avx512f", target):
        return RegisterFile(lanes=16, registers=32)
    if codegen.target_has_features("fma", target):
        return RegisterFile(lanes=8, registers=16)
    return None


def tile_roles(insts: Sequence) -> list[str | None]:
    """Per instruction of a design space's trace: "spatial", "vector" (a CPU-tiled block's last spatial
    loop), "reduction" or "unroll" for the decisions ``TileDraw`` makes; None for the rest. A block's
    spatial loops come before its reduction ones, as MetaSchedule splits them in the block's loop order."""
    roles: list[str | None] = [None] * len(insts)
    block: list[int] | None = None  # the SamplePerfectTile instructions of the CPU-tiled block being read

    def close() -> None:
        spatial = [i for i in block or [] if roles[i] == "spatial"]
        if spatial:
            roles[spatial[-1]] = "vector"

    unrolls = []
    for index, inst in enumerate(insts):
        kind = inst.kind.name
        if kind == "Annotate" and str(inst.attrs[0]) == TILING_ANNOTATION:
            close()
            block = [] if str(inst.inputs[1]) == CPU_TILING else None
        elif kind == "SamplePerfectTile" and block is not None:
            roles[index] = "spatial" if int(inst.attrs[0]) == CPU_TILING.count("S") else "reduction"
            block.append(index)
        elif kind == "Reorder" and block is not None:
            close()
            block = None
        elif kind == "Annotate" and str(inst.attrs[0]) == UNROLL_ANNOTATION:
            unrolls.append(inst.inputs[1])
    close()
    for index, inst in enumerate(insts):
        if inst.kind.name == "SampleCategorical" and any(rv.same_as(inst.outputs[0]) for rv in unrolls):
            roles[index] = "unroll"
    return roles


def register_tile(sch: tvm.s_tir.Schedule, lanes: int) -> tuple[int, int] | None:
    """The accumulator registers and inner reduction steps of a schedule's first CPU-tiled block; None
    where it has none with a vector loop."""
    rows, vector, reduction, previous = 1, None, 1, None
    for inst, role in zip(sch.trace.insts, tile_roles(sch.trace.insts), strict=True):
        if role is None or role == "unroll":
            continue
        if previous == "reduction" and role != "reduction":
            break  # the next block's loops
        previous = role
        inner = int(sch.trace.decisions[inst][-1])
        if role == "vector":
            vector = inner
        elif role == "reduction":
            reduction *= inner
        else:
            rows *= inner
    return None if vector is None else (rows * -(-vector // lanes), reduction)


def fills(sch: tvm.s_tir.Schedule, registers: RegisterFile) -> bool:
    """Whether a schedule's register tile is within what ``registers`` hold and keep busy."""
    tile = register_tile(sch, registers.lanes)
    return tile is not None and registers.min_accumulators <= tile[0] <= registers.max_accumulators


def power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def prime_powers(n: int) -> list[tuple[int, int]]:
    """``n``'s prime factors with their exponents, smallest prime first."""
    powers, prime = [], 2
    while n > 1:
        if prime * prime > n:
            prime = n
        power = 0
        while n % prime == 0:
            n //= prime
            power += 1
        if power:
            powers.append((prime, power))
        prime += 1
    return powers


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, smallest first."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


class TileDraw:
    """The decisions of one fresh sample of a design space, as a decision provider for
    ``Trace.apply_to_schedule`` (called for each instruction in order): the innermost factors of each
    CPU-tiled block drawn so that its accumulators fill the registers and its inner reduction is long,
    an unroll limit that unrolls; MetaSchedule's own draw for every other decision."""

    def __init__(self, sch: tvm.s_tir.Schedule, roles: list[str | None], registers: RegisterFile, seed: int):
        self.sch = sch
        self.roles = roles
        self.registers = registers
        self.rng = np.random.default_rng(seed)
        self.position = 0
        self.previous: str | None = None  # the role of the last tile decided
        self.rows = 1  # the block's register tile before its vector loop: product of the inner spatial factors
        self.reduction = 1  # the block's inner reduction steps so far

    def __call__(self, inst, inputs, attrs, decision):
        role = self.roles[self.position] if self.position < len(self.roles) else None
        self.position += 1
        if role is None:
            return decision
        if role == "unroll":
            return self._unroll(attrs[0])
        if self.previous == "reduction" and role != "reduction":  # the next block's loops
            self.rows, self.reduction = 1, 1
        self.previous = role
        extent = self.sch.get(inputs[0]).extent
        if not isinstance(extent, tvm.tirx.IntImm):
            return None
        inner = self._inner(role, int(extent), int(attrs[1]))
        return None if inner is None else [*self._outer(int(extent) // inner, int(attrs[0]) - 1), inner]

    def _inner(self, role: str, extent: int, max_innermost: int) -> int | None:
        factors = [d for d in divisors(extent) if d <= max_innermost]
        if role == "vector":
            inner = self._vector_factor(factors)
            self.rows = 1
            return inner
        if role == "reduction":
            wanted = -(-MIN_INNER_REDUCTION // self.reduction)
            long_enough = [d for d in factors if d >= wanted]
            inner = self._pick(long_enough) if long_enough else factors[-1]
            self.reduction *= inner
            return inner
        cap = max(1, self.registers.max_accumulators // self.rows)
        inner = self._pick([d for d in factors if d <= cap])
        self.rows *= inner
        return inner

    def _vector_factor(self, divisors: list[int]) -> int | None:
        lanes = self.registers.lanes
        whole = [d for d in divisors if d % lanes == 0]
        if not whole:
            return None

        def accumulators(d: int) -> int:
            return self.rows * d // lanes

        low = self.registers.min_accumulators
        fitting = [d for d in whole if low <= accumulators(d) and self.registers.holds(accumulators(d), d // lanes)]
        return self._pick(fitting) if fitting else min(whole, key=lambda d: abs(accumulators(d) - low))

    def _outer(self, extent: int, levels: int) -> list[int]:
        """``extent`` split at random into ``levels`` factors whose product is ``extent``."""
        factors = [1] * levels
        for prime, power in prime_powers(extent):
            for _ in range(power):
                factors[int(self.rng.integers(levels))] *= prime
        return factors

    def _pick(self, choices: list[int]) -> int:
        return choices[int(self.rng.integers(len(choices)))]

    def _unroll(self, limits: Sequence) -> int:
        """An index into the unroll limits that unrolls something: at 0 the tile's loops stay loops
        and its accumulators go through memory at every step."""
        nonzero = [i for i, limit in enumerate(limits) if int(limit) > 0]
        return self._pick(nonzero) if nonzero else 0
