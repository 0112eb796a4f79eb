"""TensorFlow's process settings, made before its first import (it reads them once, at import),
and that import without its native start-up notices.

- ``TF_CPP_MIN_LOG_LEVEL=2``: its C++ log lines below warnings are not the user's output.
- ``TF_ENABLE_ONEDNN_OPTS=1``: TensorFlow turns its oneDNN kernels on by default only on some
  x86 CPUs (Intel's with AVX-512 features); elsewhere, an AMD EPYC with AVX2 for one, it leaves
  them off. Measured on such a CPU (2 vCPUs, tensorflow-cpu 2.21): the reference 3D ResNet-18's
  step of batch 32 costs 10.6 CPU-seconds with oneDNN and 15.2 without, a small model's step
  0.09 s against 0.34 s. A CPU node's time would depend on which CPU the cloud gave, not on the
  data pipeline; trainfeed turns oneDNN on everywhere.

A user's own value of either variable wins.
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

#: What TensorFlow's native code prints while it is imported, whatever TF_CPP_MIN_LOG_LEVEL says
#: (absl logs before its logging is set up): notices, not problems.
_NOTICES = ("All log messages before absl::InitializeLog() is called are written to STDERR",
            "oneDNN custom operations are on", "This TensorFlow binary is optimized to use available CPU",
            "To enable the following instructions")


def prepare_tensorflow() -> None:
    """Set TensorFlow's environment defaults for this process (and the processes it starts)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")


def import_tensorflow() -> ModuleType:
    """``import tensorflow`` with this module's defaults; the first import in a process prints
    its other stderr lines, not the start-up notices."""
    if sys.modules.get("tensorflow") is None:  # not imported yet (or blocked: the import raises)
        prepare_tensorflow()
        with _without_notices():
            import tensorflow  # noqa: F401 - the module is sys.modules' entry
    return sys.modules["tensorflow"]


@contextmanager
def _without_notices() -> Iterator[None]:
    """File descriptor 2 into a temporary file meanwhile (native code writes there, not to
    ``sys.stderr``), then every line but the notices back to stderr."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to hold back
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not any(notice in line for notice in _NOTICES)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
