"""How a job entry point ends: a failure is an exception, never a returned code.

The Databricks python-wheel-task launcher calls the entry point and ignores what it returns,
so a job that returned 1 would show as a green run. A handled error is printed (redacted)
and raised as SystemExit with the error contract's code (1 data/runtime, 2 usage).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import trainfeed.converters.storage  # noqa: F401  the clouds: their credential variables are redacted
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.redact import redact, redact_json, register_environment


def run_job(body: Callable[[], dict[str, Any]], render: Callable[[dict[str, Any]], str] | None = None) -> int:
    """Run ``body``; print its result (JSON unless ``render`` says otherwise) and return 0, or
    print the error and raise ``SystemExit(code)``."""
    register_environment()  # credentials from the environment never appear in what is printed
    try:
        result = body()
    except TrainfeedError as exc:
        print(redact(f"error: {exc}"), file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    print(redact(render(result)) if render else redact_json(result, default=str))
    return 0
