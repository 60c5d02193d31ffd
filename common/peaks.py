"""This CPU's peak compute rates, measured by C micro-kernels built with the system's gcc: the fp32 FMA
peak (independent vector FMA chains on every core), the bf16 peak of the unit bf16 products run on (AMX's
``tdpbf16ps`` where the CPU has AMX, else ``vdpbf16ps``) and a parallel copy's bandwidth. A kernel's
fraction of peak is judged against these (``tuner report``, ``experiments/machine_limits.py``).
"""

from __future__ import annotations

import ctypes
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from common.host import cpu_flags, host_has_amx

_KERNELS = r"""
#include <omp.h>
#include <stdlib.h>
#include <string.h>
/* LANES: the host's widest registers (16 floats with AVX-512, 8 with AVX2). Wider than the registers, each
   chain takes several of them and 12 chains spill: AVX2's 16 registers read 13 GFLOP/s of ~100 on Zen 3. */
typedef float vec __attribute__((vector_size(LANES * 4)));

/* FLOPs per second of independent FMA chains: 12 accumulators (of the 16 or 32 registers) hide the FMA
   latency. */
double fma_flops(long iterations, int threads) {
    double start = omp_get_wtime();
    float sink = 0;
    #pragma omp parallel num_threads(threads) reduction(+:sink)
    {
        vec a[12], b, c;
        for (int i = 0; i < LANES; i++) { b[i] = 0.999f; c[i] = 1e-3f; }
        for (int k = 0; k < 12; k++) for (int i = 0; i < LANES; i++) a[k][i] = (float)(k + i);
        for (long n = 0; n < iterations; n++) {
            __asm__("" : "+v"(b), "+v"(c));  /* in registers: gcc read b from the stack, 134 of 212 GFLOP/s a core */
            #pragma GCC unroll 12
            for (int k = 0; k < 12; k++) a[k] = a[k] * b + c;
        }
        for (int k = 0; k < 12; k++) for (int i = 0; i < LANES; i++) sink += a[k][i];
    }
    double seconds = omp_get_wtime() - start;
    if (sink == 1234.5f) return 0;  /* keeps the result alive */
    return (double)threads * iterations * 12 * LANES * 2 / seconds;
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


def compile_c(directory: Path, name: str, source_text: str, flags: list[str]) -> ctypes.CDLL:
    source, library = directory / f"{name}.c", directory / f"{name}.so"
    source.write_text(source_text)
    command = ["gcc", "-O2", *flags, "-fopenmp", "-shared", "-fPIC", "-o", str(library), str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
        raise RuntimeError(f"gcc could not compile {name}.c ({' '.join(flags)}): {first}")
    return ctypes.CDLL(str(library))


def vector_lanes() -> int:
    """fp32 lanes of this host's widest vector registers: 16 with AVX-512, else 8 (AVX2; SSE-only hosts,
    too old to matter here, would measure below their peak)."""
    return 16 if "avx512f" in (cpu_flags() or set()) else 8


def kernel_flags() -> list[str]:
    """gcc's flags for the fp32 kernels (``_KERNELS``) on this host."""
    return ["-march=native", "-ffp-contract=fast", f"-DLANES={vector_lanes()}"]


def compile_kernels(directory: Path) -> ctypes.CDLL:
    lib = compile_c(directory, "limits", _KERNELS, kernel_flags())
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
                lib = compile_c(Path(tmp), "amx", _AMX_KERNEL, ["-mamx-tile", "-mamx-bf16"])
            except (RuntimeError, OSError) as err:
                return None, str(err), "tdpbf16ps"
            lib.amx_bf16_flops.restype = ctypes.c_double
            lib.amx_bf16_flops.argtypes = [ctypes.c_long, ctypes.c_int]
            if lib.amx_bf16_flops(1, 1) < 0:
                return None, "Linux refused this process AMX's tile data (arch_prctl)", "tdpbf16ps"
            return best_gflops(lib.amx_bf16_flops, threads, max(iterations // 16, 1)), "", "tdpbf16ps"
    return (*bf16_dot_gflops(threads, iterations), "vdpbf16ps")


def bf16_dot_gflops(threads: int, iterations: int = 20_000_000) -> tuple[float | None, str]:
    """(GFLOP/s of the AVX512_BF16 dot-product kernel on ``threads`` threads, best of three; '') or,
    where it cannot run, (None, why)."""
    if "avx512_bf16" not in (cpu_flags() or set()):
        return None, "this CPU has no avx512_bf16 in /proc/cpuinfo's flags"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            lib = compile_c(Path(tmp), "bf16", _BF16_KERNEL, ["-mavx512bf16", "-mavx512f"])
        except (RuntimeError, OSError) as err:  # an old gcc, or none
            return None, str(err)
        lib.bf16_dot_flops.restype = ctypes.c_double
        lib.bf16_dot_flops.argtypes = [ctypes.c_long, ctypes.c_int]
        return best_gflops(lib.bf16_dot_flops, threads, iterations), ""


def fma_gflops(threads: int, iterations: int = 20_000_000) -> float:
    """GFLOP/s of the fp32 FMA kernel on ``threads`` threads, best of three."""
    with tempfile.TemporaryDirectory() as tmp:
        return fma_gflops_of(compile_kernels(Path(tmp)), threads, iterations)


def fma_gflops_of(lib: ctypes.CDLL, threads: int, iterations: int) -> float:
    return best_gflops(lib.fma_flops, threads, iterations)


def best_gflops(kernel: Callable[[int, int], float], threads: int, iterations: int) -> float:
    """GFLOP/s of a peak kernel (FLOP/s of ``iterations`` on ``threads``), best of three."""
    kernel(max(iterations // 10, 1), threads)  # wake the cores up
    return max(kernel(iterations, threads) for _ in range(3)) / 1e9
