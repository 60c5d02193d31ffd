"""tensor-tuner: auto-tuning of deep-learning tensor programs on Apache TVM."""

from typing import TYPE_CHECKING

from common.lazy_exports import lazy_exports

from .errors import DatabaseError, NoDeviceError, TargetError, TunerError, WorkloadError

if TYPE_CHECKING:
    from tuner.lowering import LoweringOptions
    from tuner.runtime.compiled_model import CompiledModel, load
    from tuner.search.objectives import Objectives

    from .api import tune
    from .result import TaskResult, TuneResult

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CompiledModel": ".runtime.compiled_model",
        "LoweringOptions": ".lowering",
        "Objectives": ".search.objectives",
        "TaskResult": ".result",
        "TuneResult": ".result",
        "load": ".runtime.compiled_model",
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
