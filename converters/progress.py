"""A progress bar on stderr: items done, MB/s, ETA. Silent when disabled."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeRemainingColumn
from rich.text import Text


class _Rate(ProgressColumn):
    """MB/s of the bytes reported in the task's ``bytes`` field."""

    def render(self, task) -> Text:
        elapsed = task.elapsed or 0
        rate = task.fields.get("bytes", 0) / elapsed / 1e6 if elapsed > 0 else 0.0
        return Text(f"{rate:,.1f} MB/s", style="cyan")


class Bar:
    def __init__(self, progress: Progress | None, label: str):
        self._progress = progress
        self._label = label
        self._task = None
        self._total = None
        self._last = 0.0

    def start(self, total: int, total_bytes: int = 0) -> None:
        if self._progress is not None:
            self._task = self._progress.add_task(self._label, total=total, bytes=0)
            self._total = total

    def update(self, done: int, nbytes: int = 0) -> None:
        if self._progress is None or self._task is None:
            return
        now = time.monotonic()
        if now - self._last >= 0.1 or done == self._total:  # ten refreshes a second is plenty
            self._progress.update(self._task, completed=done, bytes=nbytes)
            self._last = now


@contextmanager
def progress_bar(enabled: bool = True, label: str = "working", unit: str = "samples") -> Iterator[Bar]:
    if not enabled:
        yield Bar(None, label)
        return
    console = Console(stderr=True)
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
               _Rate(), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=False) as progress:
        bar = Bar(progress, label)
        yield bar
