"""The same AMX tile schedule of bf16 GEMMs built with each call over the whole reduction or over
chunks of it (``bf16_rule.AMX_REDUCTION_CHUNK`` pairs, the accumulators through memory between
chunks), timed in alternation in one process, twice: warm (one weight, in the cache after the first
call, as tuning times a kernel) and streamed (the calls rotate over copies of the weight adding up to
``--stream-mb``, as a model's kernels read weights nothing has touched since the last inference).

    TVM_NUM_THREADS=2 .venv/bin/python experiments/amx_reduction_chunks.py [--rounds 5]

The shapes are BERT-base's products over 128 tokens and two of ResNet-50's 1x1 convolutions as GEMMs
(positions x outputs x inputs). Prints each shape's median latencies and the ratios; needs a CPU with AMX.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
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

SHAPES = [(128, 3072, 768), (128, 768, 3072), (128, 768, 768), (192, 256, 1024), (64, 512, 2048)]
TILE = (32, 2)  # rows x 16-channel blocks: AMX's four accumulator tiles


def built(m: int, n: int, k: int, chunks: bool) -> tvm.runtime.Module:
    sch = tvm.s_tir.Schedule(dense_module(m, n, k), seed=1)
    _tile(sch, sch.get_sblock("gemm"), *TILE, AMX, chunks=chunks)
    return tvm.compile(sch.mod, target=resolve_target("llvm")).mod


def streamed_seconds(function, data, weights, out) -> float:
    """Seconds per call over every copy of the weight, each read once."""
    start = time.perf_counter()
    for weight in weights:
        function(data, weight, out)
    return (time.perf_counter() - start) / len(weights)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--stream-mb", type=int, default=192, help="the weights' copies in all (BERT-base's: 170)")
    args = parser.parse_args()
    if not host_has_amx():
        sys.exit("amx_reduction_chunks.py: this CPU has no AMX (tdpbf16ps); run it on one with it (Sapphire Rapids on)")
    dev = tvm.cpu()
    for m, n, k in SHAPES:
        modules = {chunks: built(m, n, k, chunks) for chunks in (False, True)}
        data = tvm.runtime.tensor(bf16_array((m, k), 1), dev)
        out = tvm.runtime.tensor(np.zeros((m, n), np.float32), dev)
        packed = pack_dense_weight(bf16_array((k, n), 2))
        copies = max(2, args.stream_mb * 2**20 // packed.nbytes)
        weights = [tvm.runtime.tensor(packed.copy(), dev) for _ in range(copies)]
        warm: dict[bool, list[float]] = {chunks: [] for chunks in modules}
        streamed: dict[bool, list[float]] = {chunks: [] for chunks in modules}
        for _ in range(args.rounds):
            for chunks, module in modules.items():
                evaluator = module.time_evaluator("main", dev, number=20, repeat=3)
                warm[chunks].append(min(evaluator(data, weights[0], out).results))
                streamed[chunks].append(streamed_seconds(module["main"], data, weights, out))
        (whole_warm, chunked_warm), (whole_streamed, chunked_streamed) = (
            [statistics.median(samples[chunks]) * 1e6 for chunks in (False, True)] for samples in (warm, streamed)
        )
        print(
            f"{m}x{n}x{k} ({packed.nbytes / 2**20:.1f} MB x {copies}): warm {whole_warm:.0f} -> {chunked_warm:.0f} us "
            f"({chunked_warm / whole_warm:.3f}), streamed {whole_streamed:.0f} -> {chunked_streamed:.0f} us "
            f"({chunked_streamed / whole_streamed:.3f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
