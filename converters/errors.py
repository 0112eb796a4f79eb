"""The error contract: usage errors exit 2, data and runtime errors exit 1."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from trainfeed.converters.redact import redact, register_environment


class TrainfeedError(Exception):
    """A problem the user can act on; its message is shown without a traceback."""

    exit_code = 1


class UsageError(TrainfeedError):
    """Options that contradict each other or cannot be parsed."""

    exit_code = 2


class SampleError(TrainfeedError):
    """One source file cannot become a sample: names the file and the reason."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class VerifyError(TrainfeedError):
    """The written store differs from its source."""


@contextmanager
def exit_codes(interrupted: str = "interrupted") -> Iterator[None]:
    """The contract as a command exits (every typer command of trainfeed runs in it): a
    TrainfeedError prints its message (no traceback) and exits 1 or 2; Ctrl-C exits 130. Every
    message is redacted (no credential is ever printed)."""
    import typer  # the commands' own library, loaded only by a command

    register_environment()
    try:
        yield
    except TrainfeedError as exc:
        typer.echo(redact(f"error: {exc}"), err=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        typer.echo(interrupted, err=True)
        raise typer.Exit(130) from None
    except (typer.Exit, SystemExit):
        raise
    except Exception as exc:  # a bug or an unforeseen library error: still no secret, no traceback
        if os.environ.get("TRAINFEED_DEBUG"):
            raise
        typer.echo(redact(f"error: unexpected {type(exc).__name__}: {exc} (TRAINFEED_DEBUG=1 shows the traceback)"),
                   err=True)
        raise typer.Exit(1) from None
