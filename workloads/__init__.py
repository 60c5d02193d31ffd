"""Where models come from: built-in operators and models, and importers for user models."""

from typing import TYPE_CHECKING

from .errors import WorkloadError
from .lazy_exports import lazy_exports

if TYPE_CHECKING:
    from .importers import from_onnx, from_torch, load_workload
    from .registry import WorkloadEntry, get_workload, list_workloads
    from .workload import TensorSpec, Workload

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "TensorSpec": ".workload",
        "Workload": ".workload",
        "WorkloadEntry": ".registry",
        "from_onnx": ".importers",
        "from_torch": ".importers",
        "get_workload": ".registry",
        "list_workloads": ".registry",
        "load_workload": ".importers",
    },
)

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
