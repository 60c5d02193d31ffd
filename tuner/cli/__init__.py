"""The `tuner` command line: tune, apply, report, workloads and doctor."""

from .main import main

__all__ = ["main"]
