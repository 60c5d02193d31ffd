"""Errors that stop a tuning job with a message the user can act on."""

from workloads import WorkloadError

# ends the refusal of a torch module with operators TVM's importer does not take, under partition=False
PARTITION_HINT = "; or let tune() run them in PyTorch: drop partition=False (--no-partition)"


class TunerError(Exception):
    """A user-facing error: the message names the problem and the fix, in one line."""


class TargetError(TunerError, ValueError):
    """The target string or dict cannot be used."""


class NoDeviceError(TunerError):
    """The target's device is not present, so candidates cannot be measured here."""


class ModelError(TunerError, WorkloadError):
    """The model cannot be loaded or used as given (raised by tune() and apply() for what
    ``workloads`` refuses; still a WorkloadError for code that catches that)."""


class DatabaseError(TunerError):
    """The work dir's database is unreadable or belongs to something else."""


__all__ = [
    "PARTITION_HINT",
    "DatabaseError",
    "ModelError",
    "NoDeviceError",
    "TargetError",
    "TunerError",
    "WorkloadError",
]
