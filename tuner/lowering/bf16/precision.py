"""Whether a target can compute in bfloat16 fast, and what a bf16 run says or refuses up front.

bf16 is fast on CPUs with AVX512_BF16 (``vdpbf16ps``: twice the FMA's multiply-adds; Zen 4 and 5,
Cooper Lake, Sapphire Rapids and later) and on GPUs from sm_80 (Ampere). On an x86 CPU without it a
bf16 model still runs, computing in fp32 from bf16 storage, as PyTorch does there.
"""

from __future__ import annotations

from typing import Any

import tvm

from common.host import cpu_flags
from tuner.errors import TargetError
from tuner.targets import has_bf16_dot_product, requested_config

BF16_MIN_CUDA_ARCH = 80


def host_has_bf16() -> bool | None:
    """Whether this machine's CPU has AVX512_BF16 (None where /proc/cpuinfo cannot be read)."""
    flags = cpu_flags()
    return None if flags is None else "avx512_bf16" in flags


def check_bf16(spec: Any, target: tvm.target.Target) -> str | None:
    """For ``dtype="bfloat16"``: TargetError where ``target`` cannot compute in bf16, a warning line
    where it can only slowly (this CPU lacks AVX512_BF16), None where it is fast."""
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
        return None
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
