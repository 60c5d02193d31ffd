"""This machine's limits, measured: the fp32 FMA peak (a C kernel of independent vector FMAs on
every core), BLAS sgemm (numpy's and torch's), and memory bandwidth (a parallel copy of arrays far
larger than the last-level cache); with ``--gpu``, a GPU's (cuBLAS GEMM in fp16, a device copy).
A kernel's roofline bound is max(FLOPs / peak, bytes / bandwidth).

    .venv/bin/python experiments/machine_limits.py [--threads N]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

_KERNELS = r"""
#include <omp.h>
#include <stdlib.h>
#include <string.h>
typedef float vec __attribute__((vector_size(64)));  /* the widest the target has: AVX-512 here */

/* FLOPs per second of independent FMA chains: 12 accumulators hide the FMA latency. */
double fma_flops(long iterations, int threads) {
    double start = omp_get_wtime();
    float sink = 0;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        vec a[12], b, c;
        for (int i = 0; i < 16; i++) { b[i] = 0.999f; c[i] = 1e-3f; }
        for (int k = 0; k < 12; k++) for (int i = 0; i < 16; i++) a[k][i] = (float)(k + i);
        for (long n = 0; n < iterations; n++) {
            #pragma GCC unroll 12
            for (int k = 0; k < 12; k++) a[k] = a[k] * b + c;
        }
        for (int k = 0; k < 12; k++) for (int i = 0; i < 16; i++) sink += a[k][i];
    }
    double seconds = omp_get_wtime() - start;
    if (sink == 1234.5f) return 0;  /* keeps the result alive */
    return (double)threads * iterations * 12 * 16 * 2 / seconds;
}

/* Bytes per second (read + written) of a parallel copy, best of `repeats`. */
double copy_bytes(long floats, int threads, int repeats) {
    float *a = aligned_alloc(64, floats * sizeof(float)), *b = aligned_alloc(64, floats * sizeof(float));
    #pragma omp parallel for num_threads(threads)
    for (long i = 0; i < floats; i++) { a[i] = (float)i; b[i] = 0; }
    double best = 1e30;
    for (int r = 0; r < repeats; r++) {
        double start = omp_get_wtime();
        #pragma omp parallel for num_threads(threads)
        for (long i = 0; i < floats; i++) b[i] = a[i];
        double seconds = omp_get_wtime() - start;
        if (seconds < best) best = seconds;
    }
    double result = b[floats - 1] == (float)(floats - 1) ? 2.0 * floats * sizeof(float) / best : 0;
    free(a); free(b);
    return result;
}
"""


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

    @property
    def peak_gflops(self) -> float:
        """The compute limit a kernel is judged against: the higher of the FMA kernel and BLAS."""
        return max(self.fma_gflops, self.numpy_sgemm_gflops, self.torch_sgemm_gflops or 0.0)

    def describe(self) -> str:
        return (
            f"Machine limits ({self.threads} threads): FMA peak {self.fma_gflops:.0f} GFLOP/s, numpy sgemm "
            f"{self.numpy_sgemm_gflops:.0f}, torch sgemm {self.torch_sgemm_gflops or 0:.0f} (peak used: "
            f"{self.peak_gflops:.0f} GFLOP/s); memory copy {self.copy_gbs:.1f} GB/s."
        )


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


def _compile_kernels(directory: Path) -> ctypes.CDLL:
    source, library = directory / "limits.c", directory / "limits.so"
    source.write_text(_KERNELS)
    subprocess.run(
        [
            "gcc",
            "-O2",
            "-march=native",
            "-ffp-contract=fast",
            "-fopenmp",
            "-shared",
            "-fPIC",
            "-o",
            str(library),
            str(source),
        ],
        check=True,
    )
    lib = ctypes.CDLL(str(library))
    lib.fma_flops.restype = lib.copy_bytes.restype = ctypes.c_double
    lib.fma_flops.argtypes = [ctypes.c_long, ctypes.c_int]
    lib.copy_bytes.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    return lib


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
        lib = _compile_kernels(Path(tmp))
        lib.fma_flops(2_000_000, threads)  # wake the cores up
        fma = max(lib.fma_flops(20_000_000, threads) for _ in range(3))
        copy = lib.copy_bytes(64 * 2**20, threads, 5)  # 2 x 256 MB, far beyond the caches
    try:
        import torch

        torch.set_num_threads(threads)
        torch_sgemm = _sgemm_gflops(_TorchMatmul(torch))
    except ImportError:
        torch_sgemm = None
    return MachineLimits(threads, fma / 1e9, _sgemm_gflops(_NumpyMatmul()), torch_sgemm, copy / 1e9)


def torch_cuda_matmul_seconds(size: int, dtype: str) -> float:
    """torch.matmul's median seconds on the GPU for size^3 in ``dtype`` (CUDA events, warm)."""
    import torch

    a, b = (torch.randn(size, size, device="cuda", dtype=getattr(torch, dtype)) for _ in range(2))
    for _ in range(10):
        torch.matmul(a, b)
    return statistics.median(_cuda_event_seconds(torch, lambda: torch.matmul(a, b)) for _ in range(50))


def _cuda_event_seconds(torch, work) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="threads to measure with (default: every core)")
    parser.add_argument("--gpu", action="store_true", help="measure the GPU's limits instead (torch with CUDA)")
    args = parser.parse_args()
    print(json.dumps((measure_gpu() if args.gpu else measure(args.threads)).as_dict(), indent=1))


if __name__ == "__main__":
    main()
