"""What experiments/gpu_validation.py's steps share: the sizes of each step for a target and mode,
each step's time estimate, what a step returns, and what it is given."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Plan:
    """Sizes of each step for a target and mode, and the seconds each step is expected to take.

    Steps 8-10 go through a list (GEMM sizes, workloads, models): the first item is the step's own
    estimate; each further one runs only if its estimate (``more_seconds``) still fits the run's
    budget beside the steps after it."""

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
    versus_workloads: tuple[str, ...]  # step 9: ours and stock MetaSchedule, the same trials each
    versus_trials: int
    timing_processes: int  # step 9: processes the two artifacts are timed in, side by side
    models: tuple[str, ...]  # step 10: tuned, then timed beside PyTorch eager and torch.compile
    model_dtype: str
    model_trials: int
    model_rounds: int  # step 10: rounds of time_interleaved, each contender for model_round_seconds
    model_round_seconds: float
    seconds: dict[int, float]  # each step's estimate
    more_seconds: dict[str, float]  # each further item's (GEMM size, workload or model name)
    minutes: float | None  # the whole run's budget (--minutes): None, none

    def item_seconds(self, step: int, item: object) -> float:
        return self.more_seconds.get(str(item), self.seconds[step])


# The cuda full plan fits 8 minutes on one H100/H200: gpu_validation.py's docstring says how each
# step's estimate was derived.
PLANS = {
    ("cuda", False): Plan(
        kernel="matmul-1024",
        tune_workload="matmul-1024",
        tune_trials=16,
        engine_workload="matmul-1024",
        engine_candidates=24,
        l2_elements=1 << 21,
        nvml_seconds=2.0,
        gemm_sizes=(1024, 4096),
        gemm_dtype="float16",
        gemm_trials=16,
        versus_workloads=("matmul-1024", "matmul-llama2-7b-qproj-fp16", "conv2d-resnet50-l3"),
        versus_trials=16,
        timing_processes=1,
        models=("resnet18", "resnet50", "bert-base"),
        model_dtype="float16",
        model_trials=8,
        model_rounds=5,
        model_round_seconds=0.3,
        seconds={1: 3, 2: 5, 3: 35, 4: 35, 5: 3, 6: 3, 7: 20, 8: 60, 9: 160, 10: 140},
        more_seconds={
            "4096": 60,
            "matmul-llama2-7b-qproj-fp16": 150,
            "conv2d-resnet50-l3": 150,
            "resnet50": 220,
            "bert-base": 200,
        },
        minutes=8.0,
    ),
    ("cuda", True): Plan(
        kernel="matmul-512",
        tune_workload="matmul-512",
        tune_trials=16,
        engine_workload="matmul-512",
        engine_candidates=16,
        l2_elements=1 << 20,
        nvml_seconds=1.0,
        gemm_sizes=(1024,),
        gemm_dtype="float16",
        gemm_trials=16,
        versus_workloads=("matmul-512",),
        versus_trials=8,
        timing_processes=1,
        models=("tiny-resnet",),
        model_dtype="float16",
        model_trials=4,
        model_rounds=2,
        model_round_seconds=0.1,
        seconds={1: 3, 2: 5, 3: 25, 4: 15, 5: 3, 6: 3, 7: 15, 8: 35, 9: 120, 10: 90},
        more_seconds={},
        minutes=None,
    ),
    ("llvm", False): Plan(
        kernel="matmul-512",
        tune_workload="matmul-512",
        tune_trials=64,
        engine_workload="matmul-512",
        engine_candidates=32,
        l2_elements=1 << 16,
        nvml_seconds=0.0,
        gemm_sizes=(256,),
        gemm_dtype="float32",
        gemm_trials=32,
        versus_workloads=("matmul-512", "conv2d-resnet18-l2"),
        versus_trials=32,
        timing_processes=3,
        models=("resnet18",),
        model_dtype="float32",
        model_trials=32,
        model_rounds=5,
        model_round_seconds=0.3,
        seconds={1: 3, 2: 5, 3: 90, 4: 60, 5: 3, 6: 10, 7: 1, 8: 60, 9: 300, 10: 300},
        more_seconds={},
        minutes=None,
    ),
    # On the 2-core CPU: steps 1-8 and 10 in 45-65 s, 9 in 140-260 s
    # (stock MetaSchedule's imports of TVM's tensor intrinsics)
    ("llvm", True): Plan(
        kernel="matmul-128",
        tune_workload="matmul-128",
        tune_trials=8,
        engine_workload="matmul-128",
        engine_candidates=8,
        l2_elements=1 << 14,
        nvml_seconds=0.0,
        gemm_sizes=(64,),
        gemm_dtype="float32",
        gemm_trials=8,
        versus_workloads=("matmul-128",),
        versus_trials=8,
        timing_processes=1,
        models=("tiny-resnet",),
        model_dtype="float32",
        model_trials=4,
        model_rounds=2,
        model_round_seconds=0.1,
        seconds={1: 3, 2: 3, 3: 15, 4: 10, 5: 2, 6: 10, 7: 1, 8: 15, 9: 200, 10: 50},
        more_seconds={},
        minutes=None,
    ),
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
    spec: str = ""  # the target as given (--target), for steps that tune in processes of their own
    work_dir: Path | None = None  # tuning work dirs and artifacts (default: OUT/work)
    deadline: float | None = None  # time.monotonic() by which the run should be over (--minutes)
    reserve: float = 0.0  # seconds the steps after this one are expected to take

    @property
    def work(self) -> Path:
        return self.work_dir or self.out / "work"

    def seconds_left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - time.monotonic()

    def allows(self, seconds: float) -> bool:
        """Whether ``seconds`` more of this step leave the steps after it their time."""
        return seconds + self.reserve <= self.seconds_left()
