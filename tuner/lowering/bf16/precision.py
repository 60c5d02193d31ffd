"""Whether a target can compute in bfloat16 fast, and what a bf16 run says or refuses up front.

bf16 is fast on CPUs with AVX512_BF16 (``vdpbf16ps``: twice the FMA's multiply-adds; Zen 4 and 5,
Cooper Lake, Sapphire Rapids and later) and on GPUs from sm_80 (Ampere); not on every such CPU (an Emerald
Rapids VM with AMX off calibrated its ``vdpbf16ps`` products at 0.58 of its float32 ones), which the
calibration tells. On an x86 CPU without it a
bf16 model still runs, computing in fp32 from bf16 storage, as PyTorch does there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tvm

from codegen.bf16_dot import AMX
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
    where it can only slowly (this CPU lacks AVX512_BF16, or its bf16 products are calibrated slower than its
    float32 ones), None where it is fast."""
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
        host = target.attrs.get("mcpu") == tvm.target.codegen.llvm_get_system_cpu()  # calibrated here only
        slow = slow_bf16_products(target) if host else None
        return f"warning: {slow}" if slow else None
    mcpu = requested_config(spec).get("mcpu")
    if mcpu:
        raise TargetError(
            f"dtype bfloat16 needs AVX512_BF16, which -mcpu={mcpu} does not have: name a CPU that has it "
            "(znver4, sapphirerapids, ...), leave -mcpu out to tune for this CPU, or use dtype float32"
        )
    return (
        f"warning: this CPU ({target.attrs.get('mcpu', 'unknown')}) has no AVX512_BF16: the model will compute in "
        "float32 from bfloat16 storage and run slower than in float32; use dtype float32 here"
    )


def slow_bf16_products(target: tvm.target.Target, calibrated: Calibration | None = None) -> str | None:
    """Where this CPU's bf16 products, as calibrated, run at a lower rate than its float32 ones: what dtype
    bfloat16 costs here, in one line (an Emerald Rapids VM with AMX off: ``vdpbf16ps`` products at 156 GFLOP/s
    against 267 in float32). None where they are faster or the calibration has no bf16 figure. ``calibrated``:
    this machine's calibration for ``target`` (measured once per machine, a few seconds) unless given."""
    from tuner.spaces.calibration import calibration

    calibrated = calibrated or calibration(target)
    rate = calibrated.amx_product_gflops if bf16_unit(target) == AMX else calibrated.bf16_product_gflops
    if not rate or rate >= calibrated.product_gflops:
        return None
    return (
        f"this CPU's bf16 products run at {rate / calibrated.product_gflops:.2f} of its float32 ones' rate ({rate:.0f} "
        f"against {calibrated.product_gflops:.0f} GFLOP/s, calibrated): dtype bfloat16 halves what weights and "
        "activations take in memory, but a model bound by its products runs slower than in float32 here"
    )
