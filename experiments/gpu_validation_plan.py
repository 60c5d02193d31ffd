"""What experiments/gpu_validation.py's steps share: the sizes of each step for a target and mode,
what a step returns, and what it is given."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Plan:
    """Sizes of each step for a target and mode."""

    kernel: str  # step 2
    tune_workload: str  # step 3
    tune_trials: int
    engine_workload: str  # step 4
    engine_candidates: int
    l2_elements: int  # step 5: per buffer of a three-buffer elementwise kernel that fits in the L2
    nvml_seconds: float  # step 7
    gemm_sizes: tuple[int, ...]  # step 8
    gemm_dtype: str
    gemm_trials: int


PLANS = {
    ("cuda", False): Plan(
        "matmul-1024", "matmul-1024", 64, "matmul-1024", 64, 1 << 21, 2.0, (1024, 4096), "float16", 64
    ),
    ("cuda", True): Plan("matmul-512", "matmul-512", 16, "matmul-512", 16, 1 << 20, 1.0, (1024,), "float16", 16),
    ("llvm", False): Plan("matmul-512", "matmul-512", 64, "matmul-512", 32, 1 << 16, 0.0, (256,), "float32", 32),
    ("llvm", True): Plan("matmul-128", "matmul-128", 8, "matmul-128", 8, 1 << 14, 0.0, (64,), "float32", 8),
}


@dataclass
class StepResult:
    ok: bool | None  # None: not applicable here
    summary: str
    details: dict = field(default_factory=dict)


@dataclass
class Context:
    target: object  # tvm.target.Target
    device: str  # "cuda" or "cpu"
    plan: Plan
    out: Path
    engine: object = None  # the MeasureEngine steps 2 and 4-7 share
