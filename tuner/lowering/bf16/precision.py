"""Whether a target can compute in bfloat16 fast, and what a bf16 run says or refuses up front.

bf16 is fast on CPUs with AVX512_BF16 (``vdpbf16ps``: twice the FMA's multiply-adds; Zen 4 and 5,
Cooper Lake, Sapphire Rapids and later) and on GPUs from sm_80 (Ampere); not on every such CPU (an Emerald
Rapids VM with AMX off calibrated its ``vdpbf16ps`` products at 0.58 of its float32 ones), which the
calibration tells. On an x86 CPU without it a
bf16 model computes as a float32 one (``lacks_bf16_unit``): fp32 arithmetic from bf16 storage, as PyTorch
computes bf16 there, runs slower than float32 itself, and OpenVINO's default precision there is float32.

Where the calibration says this CPU's bf16 products are the slower ones, each product takes the precision
that runs it faster (``ProductPrecision``): a product's time is its FLOPs at the calibrated product rate of
the precision or its operands' bytes at the calibrated bandwidth, whichever is longer. A convolution or a
dense layer over a few dozen rows or more is bound by its arithmetic and computes in float32, lowered as
dtype float32 lowers it (Winograd's and Strassen's rewrites included); a product over a few rows (a
classifier over one token) is bound by its weights' bytes and reads them in bf16, half of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import tvm

from common.host import cpu_flags
from tuner.errors import TargetError
from tuner.targets import bf16_unit, has_bf16_dot_product, requested_config

if TYPE_CHECKING:
    from tuner.spaces.calibration import Calibration

BF16_MIN_CUDA_ARCH = 80


def host_has_bf16() -> bool | None:
    """Whether this machine's CPU has AVX512_BF16 (None where /proc/cpuinfo cannot be read)."""
    flags = cpu_flags()
    return None if flags is None else "avx512_bf16" in flags


def check_bf16(spec: Any, target: tvm.target.Target) -> str | None:
    """For ``dtype="bfloat16"``: TargetError where ``target`` cannot compute in bf16, a warning line
    where this CPU has no bf16 unit (the model computes as float32), a line saying which products compute in float32
    where its bf16 products are calibrated slower than its float32 ones, None where it is fast."""
    if target.kind.name == "cuda":
        arch = str(target.attrs.get("arch", ""))
        number = int(arch.removeprefix("sm_").rstrip("a")) if arch.startswith("sm_") else None
        if number is not None and number < BF16_MIN_CUDA_ARCH:
            raise TargetError(
                f"dtype bfloat16 needs a GPU of sm_{BF16_MIN_CUDA_ARCH} or later, and the target is {arch}: use "
                "dtype float16 there"
            )
        return None
    if has_bf16_dot_product(target):
        return slow_bf16_products(target) if _calibrated_here(target) else None
    mcpu = requested_config(spec).get("mcpu")
    if mcpu:
        raise TargetError(
            f"dtype bfloat16 needs AVX512_BF16, which -mcpu={mcpu} does not have: name a CPU that has it "
            "(znver4, sapphirerapids, ...), leave -mcpu out to tune for this CPU, or use dtype float32"
        )
    return (
        f"warning: this CPU ({target.attrs.get('mcpu', 'unknown')}) has no AVX512_BF16: dtype bfloat16 computes as "
        "float32 here, which runs faster than float32 arithmetic from bfloat16 storage would"
    )


def lacks_bf16_unit(target: tvm.target.Target | None) -> bool:
    """Whether ``target`` is a CPU with no bf16 unit (neither AVX512_BF16 nor AMX): a bf16 model computes as a
    float32 one there (module docstring)."""
    return target is not None and target.kind.name == "llvm" and bf16_unit(target) is None


def _calibrated_here(target: tvm.target.Target) -> bool:
    """Whether ``target`` is this machine's CPU, the one calibration can measure."""
    return target.kind.name == "llvm" and target.attrs.get("mcpu") == tvm.target.codegen.llvm_get_system_cpu()


def slow_bf16_products(target: tvm.target.Target, calibrated: Calibration | None = None) -> str | None:
    """Where this CPU's bf16 products, as calibrated, run at a lower rate than its float32 ones: what dtype
    bfloat16 does here, in one line (an Emerald Rapids VM with AMX off: ``vdpbf16ps`` products at 156 GFLOP/s
    against 267 in float32). None where they are faster or the calibration has no bf16 figure. ``calibrated``:
    this machine's calibration for ``target`` (measured once per machine, a few seconds) unless given."""
    from tuner.spaces.calibration import calibration

    calibrated = calibrated or calibration(target)
    rate = _slower_bf16_rate(target, calibrated)
    if rate is None:
        return None
    return (
        f"this CPU's bf16 products run at {rate / calibrated.product_gflops:.2f} of its float32 ones' rate ({rate:.0f} "
        f"against {calibrated.product_gflops:.0f} GFLOP/s, calibrated): with dtype bfloat16 the products bound by "
        "their arithmetic compute in float32 here, those bound by their operands' bytes in bf16"
    )


@dataclass(frozen=True)
class ProductPrecision:
    """Which products compute in bf16 where bf16 products are the slower ones (module docstring): rates in
    GFLOP/s, the bandwidth the operands are read at in GB/s."""

    float32_gflops: float
    bf16_gflops: float
    bandwidth_gbs: float

    def in_bf16(self, flops: float, operand_values: float) -> bool:
        """Whether a product of ``flops`` reading ``operand_values`` values (its weights and activation)
        runs faster from bf16 operands than in float32."""
        return self._seconds(flops, self.bf16_gflops, 2 * operand_values) < self._seconds(
            flops, self.float32_gflops, 4 * operand_values
        )

    def _seconds(self, flops: float, gflops: float, operand_bytes: float) -> float:
        return max(flops / gflops, operand_bytes / self.bandwidth_gbs) / 1e9


def product_precision(target: tvm.target.Target) -> ProductPrecision | None:
    """The choice of precision per product for dtype bfloat16 on ``target``, where this machine's calibration
    says its bf16 products run slower than its float32 ones; None where they do not (every product in bf16),
    where ``target`` is not this machine's CPU or its CPU has no bf16 unit."""
    if not has_bf16_dot_product(target) or not _calibrated_here(target):
        return None
    from tuner.spaces.calibration import calibration

    calibrated = calibration(target)
    rate = _slower_bf16_rate(target, calibrated)
    return None if rate is None else ProductPrecision(calibrated.product_gflops, rate, calibrated.bandwidth_gbs)


def _slower_bf16_rate(target: tvm.target.Target, calibrated: Calibration) -> float | None:
    """The calibrated rate of ``target``'s bf16 products where it is below its float32 products'; else None."""
    rate = calibrated.bf16_product_rate(bf16_unit(target))
    return rate if rate and rate < calibrated.product_gflops else None
