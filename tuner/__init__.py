"""tensor-tuner: auto-tuning of deep-learning tensor programs on Apache TVM."""

from .api import tune
from .errors import DatabaseError, NoDeviceError, TargetError, TunerError, WorkloadError
from .lowering import LoweringOptions
from .objectives import Objectives
from .result import TaskResult, TuneResult
from .runtime import CompiledModel, load

__all__ = [
    "CompiledModel",
    "DatabaseError",
    "LoweringOptions",
    "NoDeviceError",
    "Objectives",
    "TargetError",
    "TaskResult",
    "TuneResult",
    "TunerError",
    "WorkloadError",
    "load",
    "tune",
]
