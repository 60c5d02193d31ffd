"""tensor-tuner: auto-tuning of deep-learning tensor programs on Apache TVM."""

from typing import TYPE_CHECKING

from workloads.lazy_exports import lazy_exports

from .errors import DatabaseError, NoDeviceError, TargetError, TunerError, WorkloadError

if TYPE_CHECKING:
    from .api import tune
    from .lowering import LoweringOptions
    from .objectives import Objectives
    from .result import TaskResult, TuneResult
    from .runtime import CompiledModel, load

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CompiledModel": ".runtime",
        "LoweringOptions": ".lowering",
        "Objectives": ".objectives",
        "TaskResult": ".result",
        "TuneResult": ".result",
        "load": ".runtime",
        "tune": ".api",
    },
)

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
