"""Errors a user can fix by changing what they pass in."""


class WorkloadError(ValueError):
    """The model given to the tuner cannot be used; the message says why and what to do.
    ``unsupported``: the operators an importer refused, where that is why (``"erfinv.default"``)."""

    def __init__(self, message: str, unsupported: list[str] | None = None):
        super().__init__(message)
        self.unsupported = unsupported or []
