"""Every built-in workload: importing this module imports the modules that register them (the
operators and the models), so the lookups it exports see them all. The package's ``get_workload``,
``list_workloads`` and ``load_workload`` (which looks names up in the registry) come from here."""

from . import models, operators  # noqa: F401 - registered as they are imported
from .importers import load_workload
from .registry import get_workload, list_workloads

__all__ = ["get_workload", "list_workloads", "load_workload"]
