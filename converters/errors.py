"""The error contract: usage errors exit 2, data and runtime errors exit 1."""
from __future__ import annotations


class TrainfeedError(Exception):
    """A problem the user can act on; its message is shown without a traceback."""

    exit_code = 1


class UsageError(TrainfeedError):
    """Options that contradict each other or cannot be parsed."""

    exit_code = 2


class SampleError(TrainfeedError):
    """One source file cannot become a sample: names the file and the reason."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class VerifyError(TrainfeedError):
    """The written store differs from its source."""
