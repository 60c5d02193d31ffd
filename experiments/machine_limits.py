"""This machine's limits, measured: the fp32 FMA peak (a C kernel of independent vector FMAs on
every core), the bf16 peak of the unit bf16 products run on (AMX's ``tdpbf16ps`` on independent
tiles where the CPU has AMX, else the FMA kernel's twin with ``vdpbf16ps`` where it has
AVX512_BF16), BLAS sgemm (numpy's and torch's), and memory bandwidth (a parallel copy of arrays far
larger than the last-level cache); with ``--gpu``, a GPU's (cuBLAS GEMM in fp16, a device copy).
A kernel's roofline bound is max(FLOPs / peak, bytes / bandwidth).

    .venv/bin/python experiments/machine_limits.py [--threads N]
    .venv/bin/python experiments/machine_limits.py --product   # our configured product against torch's
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from common.environment import environment
from common.peaks import bf16_dot_gflops, bf16_peak, compile_kernels, fma_gflops, fma_gflops_of

__all__ = ["GpuLimits", "MachineLimits", "bf16_dot_gflops", "bf16_peak", "fma_gflops", "measure", "measure_gpu"]


class _Roofline:
    peak_gflops: float
    copy_gbs: float

    def bound_seconds(self, flops: float, bytes_moved: float) -> float:
        """The roofline bound: the time the FLOPs take at peak, or the bytes at full bandwidth."""
        return max(flops / (self.peak_gflops * 1e9), bytes_moved / (self.copy_gbs * 1e9))

    def as_dict(self) -> dict:
        return {**asdict(self), "peak_gflops": self.peak_gflops}


@dataclass
class MachineLimits(_Roofline):
    threads: int
    fma_gflops: float
    numpy_sgemm_gflops: float
    torch_sgemm_gflops: float | None
    copy_gbs: float
    bf16_peak_gflops: float | None = None  # the bf16 unit's peak kernel's; None where it cannot run
    bf16_absent: str = ""  # why it cannot
    bf16_unit: str = "vdpbf16ps"  # the instruction of that kernel: tdpbf16ps (AMX) or vdpbf16ps

    @property
    def peak_gflops(self) -> float:
        """The compute limit a kernel is judged against: the higher of the FMA kernel and BLAS."""
        return max(self.fma_gflops, self.numpy_sgemm_gflops, self.torch_sgemm_gflops or 0.0)

    def describe(self) -> str:
        return (
            f"Machine limits ({self.threads} threads): FMA peak {self.fma_gflops:.0f} GFLOP/s, numpy sgemm "
            f"{self.numpy_sgemm_gflops:.0f}, torch sgemm {self.torch_sgemm_gflops or 0:.0f} (peak used: "
            f"{self.peak_gflops:.0f} GFLOP/s); {self._bf16_text()}; memory copy {self.copy_gbs:.1f} GB/s."
        )

    def _bf16_text(self) -> str:
        if self.bf16_peak_gflops is None:
            return f"bf16 dot-product peak absent ({self.bf16_absent or 'not measured'})"
        return f"bf16 peak ({self.bf16_unit}) {self.bf16_peak_gflops:.0f} GFLOP/s"


@dataclass
class GpuLimits(_Roofline):
    """A GPU's limits as its vendor libraries reach them: cuBLAS on a large GEMM in the dtype the
    models run in (tensor cores for fp16) and a device-to-device copy."""

    device: str
    dtype: str
    gemm_gflops: float
    copy_gbs: float

    @property
    def peak_gflops(self) -> float:
        return self.gemm_gflops

    def describe(self) -> str:
        return (
            f"GPU limits ({self.device}): torch.matmul (cuBLAS) {GPU_GEMM_SIZE}^3 {self.dtype} "
            f"{self.gemm_gflops:.0f} GFLOP/s (the peak used); device copy {self.copy_gbs:.0f} GB/s."
        )


GPU_GEMM_SIZE = 8192


def _sgemm_gflops(matmul, size: int = 2048, seconds: float = 1.0) -> float:
    a, b = (np.random.default_rng(i).standard_normal((size, size)).astype("float32") for i in range(2))
    a, b = matmul.prepare(a), matmul.prepare(b)
    matmul(a, b)
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        matmul(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


class _NumpyMatmul:
    prepare = staticmethod(lambda x: x)
    __call__ = staticmethod(np.matmul)


class _TorchMatmul:
    def __init__(self, torch):
        self.torch = torch
        self.prepare = torch.from_numpy

    def __call__(self, a, b):
        return self.torch.mm(a, b)


def measure(threads: int | None = None) -> MachineLimits:
    """Measure this machine's limits with ``threads`` threads (default: every core)."""
    threads = threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        lib = compile_kernels(Path(tmp))
        fma = fma_gflops_of(lib, threads, 20_000_000)
        copy = lib.copy_bytes(64 * 2**20, threads, 5)  # 2 x 256 MB, far beyond the caches
    bf16, bf16_absent, bf16_unit = bf16_peak(threads)
    try:
        import torch

        torch.set_num_threads(threads)
        torch_sgemm = _sgemm_gflops(_TorchMatmul(torch))
    except ImportError:
        torch_sgemm = None
    numpy_sgemm = _sgemm_gflops(_NumpyMatmul())
    return MachineLimits(threads, fma, numpy_sgemm, torch_sgemm, copy / 1e9, bf16, bf16_absent, bf16_unit)


def torch_cuda_matmul_seconds(size: int, dtype: str) -> float:
    """torch.matmul's median seconds on the GPU for size^3 in ``dtype`` (CUDA events, warm). Each
    sample times a run of products queued back to back: between two events around one call, the GPU
    would wait for the host's dispatch (tens of microseconds, more than a 1024^3 product takes)."""
    import torch

    a, b = (torch.randn(size, size, device="cuda", dtype=getattr(torch, dtype)) for _ in range(2))
    for _ in range(10):
        torch.matmul(a, b)
    once = _cuda_event_seconds(torch, lambda: torch.matmul(a, b))
    calls = max(1, min(1000, int(2e-3 / max(once, 1e-7))))  # about 2 ms a sample at most

    def run() -> None:
        for _ in range(calls):
            torch.matmul(a, b)

    return statistics.median(_cuda_event_seconds(torch, run) for _ in range(20)) / calls


def _cuda_event_seconds(torch, work) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    work()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3


def measure_gpu(dtype: str = "float16") -> GpuLimits:
    """The limits of the GPU torch sees as cuda:0 (needs torch with CUDA)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA GPU: measuring a GPU's limits needs torch built with CUDA on a GPU host")
    gemm = 2 * GPU_GEMM_SIZE**3 / torch_cuda_matmul_seconds(GPU_GEMM_SIZE, dtype) / 1e9
    source = torch.empty(2**28, dtype=torch.float32, device="cuda")  # 1 GiB, far beyond the L2
    target = torch.empty_like(source)
    target.copy_(source)
    copy = min(_cuda_event_seconds(torch, lambda: target.copy_(source)) for _ in range(10))
    return GpuLimits(torch.cuda.get_device_name(0), dtype, gemm, 2 * source.nbytes / copy / 1e9)


def product_side_by_side(threads: int, rounds: int = 12, calls: int = 20) -> dict:
    """The calibration's product (BERT-base's 128 x 768 x 768, ``tuner.spaces.calibration``) with its analytic
    schedule against torch.mm (oneDNN/MKL) on the same shape, interleaved round by round on ``threads`` threads:
    GFLOP/s (median and best of the rounds, each the mean of ``calls`` calls) and the median per-round ratio of
    our time to torch's. Where the two sit together below the FMA peak, the machine's sustained rate, not the
    schedule's code, holds the product."""
    import torch

    from tuner.spaces import calibration

    torch_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with environment({"TVM_NUM_THREADS": str(threads)}):  # TVM's pool reads it at each launch
            times = _interleaved_rounds(torch, rounds, calls)
    finally:
        torch.set_num_threads(torch_threads)
    flops = calibration._PRODUCT_FLOPS
    rows, columns, depth = calibration._PRODUCT

    def rates(seconds: list[float]) -> dict:
        return {"median_gflops": flops / statistics.median(seconds) / 1e9, "best_gflops": flops / min(seconds) / 1e9}

    return {
        "shape": [rows, columns, depth],
        "threads": threads,
        "ours": rates([o for o, _ in times]),
        "torch": rates([t for _, t in times]),
        "ours_over_torch": statistics.median(o / t for o, t in times),
        "fma_peak_gflops": fma_gflops(threads),
    }


def _interleaved_rounds(torch, rounds: int, calls: int) -> list[tuple[float, float]]:
    """(our seconds, torch's seconds) a call of the calibration's product, each round's mean of ``calls``."""
    import tvm

    from tuner.spaces import calibration
    from tuner.targets import resolve_target

    target = resolve_target("llvm")
    mod = calibration._configured_product(target)
    kernel = tvm.compile(mod, target=target).mod
    arrays = calibration._zeros(calibration._argument_specs(mod))
    ours = kernel.time_evaluator(kernel.entry_name, tvm.cpu(), number=calls, repeat=1)
    rows, columns, depth = calibration._PRODUCT
    a, w, out = torch.randn(rows, depth), torch.randn(depth, columns), torch.empty(rows, columns)

    def torch_seconds() -> float:
        start = time.perf_counter()
        for _ in range(calls):
            torch.mm(a, w, out=out)
        return (time.perf_counter() - start) / calls

    def round_of_both(first_ours: bool) -> tuple[float, float]:
        # each goes first in every other round: torch's OpenMP threads spin on after a call, slowing what follows
        if first_ours:
            mine = ours(*arrays).mean
            return mine, torch_seconds()
        theirs = torch_seconds()
        return ours(*arrays).mean, theirs

    round_of_both(True)  # warm
    return [round_of_both(r % 2 == 0) for r in range(rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="threads to measure with (default: every core)")
    parser.add_argument("--gpu", action="store_true", help="measure the GPU's limits instead (torch with CUDA)")
    parser.add_argument(
        "--product", action="store_true", help="our configured product against torch.mm's, side by side, instead"
    )
    args = parser.parse_args()
    if args.product:
        print(json.dumps(product_side_by_side(args.threads or os.cpu_count() or 1), indent=1))
        return
    limits = measure_gpu() if args.gpu else measure(args.threads)
    print(json.dumps(limits.as_dict(), indent=1))
    print(limits.describe())


if __name__ == "__main__":
    main()
