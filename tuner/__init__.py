"""tensor-tuner: auto-tuning of deep-learning tensor programs on Apache TVM."""

from .api import tune
from .objectives import Objectives
from .errors import DatabaseError, NoDeviceError, TargetError, TunerError, WorkloadError
from .result import TaskResult, TuneResult

__all__ = ["DatabaseError", "NoDeviceError", "Objectives", "TargetError", "TaskResult", "TuneResult", "TunerError", "WorkloadError", "tune"]
