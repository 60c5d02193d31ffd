"""This machine's limits, measured: the fp32 FMA peak (a C kernel of independent vector FMAs on
every core), the bf16 peak of the unit bf16 products run on (AMX's ``tdpbf16ps`` on independent
tiles where the CPU has AMX, else the FMA kernel's twin with ``vdpbf16ps`` where it has
AVX512_BF16), BLAS sgemm (numpy's and torch's), and memory bandwidth (a parallel copy of arrays far
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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from common.host import cpu_flags, host_has_amx

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

# vdpbf16ps on 512 bits: 32 bf16 products summed pairwise into 16 fp32 lanes, 64 FLOPs. 16 chains
# (of the 32 zmm registers) cover its latency at two per cycle.
_BF16_KERNEL = r"""
#include <immintrin.h>
#include <omp.h>
#define CHAINS 16
double bf16_dot_flops(long iterations, int threads) {
    double start = omp_get_wtime();
    float sink = 0;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        __m512 acc[CHAINS];
        /* bf16 1.0 and about 1e-3 */
        __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3a83);
        for (int k = 0; k < CHAINS; k++) acc[k] = _mm512_set1_ps((float)k);
        for (long n = 0; n < iterations; n++) {
            #pragma GCC unroll 16
            for (int k = 0; k < CHAINS; k++) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
        }
        for (int k = 0; k < CHAINS; k++) sink += _mm512_reduce_add_ps(acc[k]);
    }
    double seconds = omp_get_wtime() - start;
    if (sink == 1234.5f) return 0;  /* keeps the result alive */
    return (double)threads * iterations * CHAINS * 64 / seconds;
}
"""


# tdpbf16ps: a 16x16 fp32 block += 16x32 by 32x16 bf16, 16,384 FLOPs. Four independent accumulator
# blocks (of the eight tiles) keep the tile unit busy.
_AMX_KERNEL = r"""
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
struct tile_config {
    unsigned char palette, start_row, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
};
/* static: gcc drops the stores of a configuration built on the stack, not seeing ldtilecfg read them */
static const struct tile_config config = {
    1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
double amx_bf16_flops(long iterations, int threads) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return -1;
    double start = omp_get_wtime();
    #pragma omp parallel num_threads(threads)
    {
        _tile_loadconfig(&config);
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
        for (long n = 0; n < iterations; n++) {
            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7); _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
        }
        _tile_release();
    }
    double seconds = omp_get_wtime() - start;
    return (double)threads * iterations * 4 * 16384 / seconds;
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


def _compile(directory: Path, name: str, source_text: str, flags: list[str]) -> ctypes.CDLL:
    source, library = directory / f"{name}.c", directory / f"{name}.so"
    source.write_text(source_text)
    command = ["gcc", "-O2", *flags, "-fopenmp", "-shared", "-fPIC", "-o", str(library), str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
        raise RuntimeError(f"gcc could not compile {name}.c ({' '.join(flags)}): {first}")
    return ctypes.CDLL(str(library))


def _compile_kernels(directory: Path) -> ctypes.CDLL:
    lib = _compile(directory, "limits", _KERNELS, ["-march=native", "-ffp-contract=fast"])
    lib.fma_flops.restype = lib.copy_bytes.restype = ctypes.c_double
    lib.fma_flops.argtypes = [ctypes.c_long, ctypes.c_int]
    lib.copy_bytes.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    return lib


def bf16_peak(threads: int, iterations: int = 20_000_000) -> tuple[float | None, str, str]:
    """(GFLOP/s, why absent, instruction) of the unit bf16 products run on here: AMX's where the CPU has
    it, else AVX512_BF16's (``bf16_dot_gflops``)."""
    if host_has_amx():
        with tempfile.TemporaryDirectory() as tmp:
            try:
                lib = _compile(Path(tmp), "amx", _AMX_KERNEL, ["-mamx-tile", "-mamx-bf16"])
            except (RuntimeError, OSError) as err:
                return None, str(err), "tdpbf16ps"
            lib.amx_bf16_flops.restype = ctypes.c_double
            lib.amx_bf16_flops.argtypes = [ctypes.c_long, ctypes.c_int]
            if lib.amx_bf16_flops(1, 1) < 0:
                return None, "Linux refused this process AMX's tile data (arch_prctl)", "tdpbf16ps"
            return _best_gflops(lib.amx_bf16_flops, threads, max(iterations // 16, 1)), "", "tdpbf16ps"
    return (*bf16_dot_gflops(threads, iterations), "vdpbf16ps")


def bf16_dot_gflops(threads: int, iterations: int = 20_000_000) -> tuple[float | None, str]:
    """(GFLOP/s of the AVX512_BF16 dot-product kernel on ``threads`` threads, best of three; '') or,
    where it cannot run, (None, why)."""
    if "avx512_bf16" not in (cpu_flags() or set()):
        return None, "this CPU has no avx512_bf16 in /proc/cpuinfo's flags"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            lib = _compile(Path(tmp), "bf16", _BF16_KERNEL, ["-mavx512bf16", "-mavx512f"])
        except (RuntimeError, OSError) as err:  # an old gcc, or none
            return None, str(err)
        lib.bf16_dot_flops.restype = ctypes.c_double
        lib.bf16_dot_flops.argtypes = [ctypes.c_long, ctypes.c_int]
        return _best_gflops(lib.bf16_dot_flops, threads, iterations), ""


def fma_gflops(threads: int, iterations: int = 20_000_000) -> float:
    """GFLOP/s of the fp32 FMA kernel on ``threads`` threads, best of three."""
    with tempfile.TemporaryDirectory() as tmp:
        return _fma_gflops(_compile_kernels(Path(tmp)), threads, iterations)


def _fma_gflops(lib: ctypes.CDLL, threads: int, iterations: int) -> float:
    return _best_gflops(lib.fma_flops, threads, iterations)


def _best_gflops(kernel: Callable[[int, int], float], threads: int, iterations: int) -> float:
    """GFLOP/s of a peak kernel (FLOP/s of ``iterations`` on ``threads``), best of three."""
    kernel(max(iterations // 10, 1), threads)  # wake the cores up
    return max(kernel(iterations, threads) for _ in range(3)) / 1e9


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
        fma = _fma_gflops(lib, threads, 20_000_000)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="threads to measure with (default: every core)")
    parser.add_argument("--gpu", action="store_true", help="measure the GPU's limits instead (torch with CUDA)")
    args = parser.parse_args()
    limits = measure_gpu() if args.gpu else measure(args.threads)
    print(json.dumps(limits.as_dict(), indent=1))
    print(limits.describe())


if __name__ == "__main__":
    main()
