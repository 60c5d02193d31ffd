"""Where models come from: built-in operators and models, and importers for user models."""

from .errors import WorkloadError
from .importers import from_onnx, from_torch, load_workload
from .registry import WorkloadEntry, get_workload, list_workloads
from .workload import TensorSpec, Workload

__all__ = [
    "TensorSpec",
    "Workload",
    "WorkloadEntry",
    "WorkloadError",
    "from_onnx",
    "from_torch",
    "get_workload",
    "list_workloads",
    "load_workload",
]
