"""Where models come from: built-in operators and models, and importers for user models."""

from typing import TYPE_CHECKING

from common.lazy_exports import lazy_exports

from .errors import WorkloadError

if TYPE_CHECKING:
    from .catalog import get_workload, list_workloads, load_workload
    from .importers import from_onnx, from_torch
    from .registry import WorkloadEntry
    from .workload import TensorSpec, Workload

# Names are looked up in the catalog, which imports every module that registers a built-in workload.
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "TensorSpec": ".workload",
        "Workload": ".workload",
        "WorkloadEntry": ".registry",
        "from_onnx": ".importers",
        "from_torch": ".importers",
        "get_workload": ".catalog",
        "list_workloads": ".catalog",
        "load_workload": ".catalog",
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
