"""The same AMX tile schedule of bf16 GEMMs built twice, its accumulators loaded from C (the zeros the
initialisation just stored) or started as zero tiles, timed in alternation in one process.

    TVM_NUM_THREADS=2 .venv/bin/python experiments/amx_zero_tiles.py [--rounds 7]

The shapes are ResNet-50's 1x1 convolutions as GEMMs (positions x outputs x inputs). Prints each
shape's median latency both ways and their ratio; needs a CPU with AMX.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
import tvm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from bf16_builds import bf16_array, dense_module  # noqa: E402

from codegen.bf16_dot import AMX  # noqa: E402
from common.host import host_has_amx  # noqa: E402
from tuner.lowering.bf16.kernels import pack_dense_weight  # noqa: E402
from tuner.spaces.bf16_rule import _tile  # noqa: E402
from tuner.targets import resolve_target  # noqa: E402

SHAPES = [(3136, 64, 256), (3136, 256, 64), (768, 128, 512)]
TILE = (32, 2)  # rows x 16-channel blocks: AMX's four accumulator tiles


def built(m: int, n: int, k: int, zero_tiles: bool) -> tvm.runtime.Module:
    sch = tvm.s_tir.Schedule(dense_module(m, n, k), seed=1)
    _tile(sch, sch.get_sblock("gemm"), *TILE, AMX, zero_tiles=zero_tiles)
    return tvm.compile(sch.mod, target=resolve_target("llvm")).mod


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not host_has_amx():
        sys.exit(
            "amx_zero_tiles.py: this CPU has no AMX (tdpbf16ps); run it on one that has (Sapphire Rapids or later)"
        )
    dev = tvm.cpu()
    for m, n, k in SHAPES:
        modules = {zero: built(m, n, k, zero) for zero in (False, True)}
        data, weight = bf16_array((m, k), 1), pack_dense_weight(bf16_array((k, n), 2))
        tensors = [tvm.runtime.tensor(a, dev) for a in (data, weight, np.zeros((m, n), np.float32))]
        samples: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for zero, module in modules.items():
                evaluator = module.time_evaluator("main", dev, number=50, repeat=3)
                samples[zero].append(min(evaluator(*tensors).results))
        loaded, zeroed = (statistics.median(samples[z]) * 1e6 for z in (False, True))
        print(f"{m}x{n}x{k}: C loaded {loaded:.1f} us, zero tiles {zeroed:.1f} us, ratio {zeroed / loaded:.3f}")


if __name__ == "__main__":
    main()
