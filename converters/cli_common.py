"""What every command line of trainfeed shares: the error contract and `--storage-option`."""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import typer

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.redact import redact, register_environment, register_storage_options


@contextmanager
def exit_codes(interrupted: str = "interrupted") -> Iterator[None]:
    """The CLI error contract: a TrainfeedError prints its message (no traceback) and exits 1
    or 2; Ctrl-C exits 130. Every message is redacted (no credential is ever printed)."""
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


def parse_storage_options(pairs: list[str]) -> dict[str, str]:
    """`--storage-option KEY=VALUE` pairs as fsspec / delta-rs options; secret values are
    registered for redaction before anything can print them."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            # the text is not echoed: a mistyped pair (key:secret) may hold a credential
            raise UsageError("--storage-option expects KEY=VALUE; one has no '=' or no key")
        # fsspec backends take real booleans (anon=false must not be the truthy string "false")
        out[key.strip()] = {"true": True, "false": False}.get(value.strip().lower(), value)
    register_storage_options(out)
    return out
