"""Errors a user can fix by changing what they pass in."""


class WorkloadError(ValueError):
    """The model given to the tuner cannot be used; the message says why and what to do."""
