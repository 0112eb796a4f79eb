"""Progress on stderr, never stdout (which stays machine-readable under ``--json``); silent when
disabled.

- ``progress_bar``: one bar for one long run (convert, train): items done, MB/s, ETA.
- ``MatrixProgress``: a benchmark matrix: which cell (i/N), which measurement, steps done,
  elapsed time and ETAs, so minutes of measuring are not minutes of silence. On a terminal one
  line is redrawn in place (throttled); in logs and pipes a plain line is written at each
  phase's start, each quarter of its steps, at most once a minute otherwise, and at each
  cell's end. ``NullProgress`` takes the same calls and shows nothing."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class _Rate(ProgressColumn):
    """MB/s of the bytes reported in the task's ``bytes`` field."""

    def render(self, task: Task) -> Text:
        elapsed = task.elapsed or 0
        rate = task.fields.get("bytes", 0) / elapsed / 1e6 if elapsed > 0 else 0.0
        return Text(f"{rate:,.1f} MB/s", style="cyan")


class Bar:
    def __init__(self, progress: Progress | None, label: str) -> None:
        self._progress = progress
        self._label = label
        self._task: TaskID | None = None
        self._total: int | None = None
        self._last = 0.0

    def start(self, total: int) -> None:
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


# ---------------------------------------------------------------- a benchmark matrix

#: Terminal redraws at most this often: faster is unreadable and costs the measured loop.
REDRAW_S = 0.25
#: Fractions of a phase's steps at which a log line is written.
MILESTONES = (0.25, 0.5, 0.75, 1.0)
#: Longest silence in a log while a phase runs (phases with unknown or slow steps).
HEARTBEAT_S = 60.0


def fmt_duration(seconds: float) -> str:
    """``"14 s"``, ``"2 min 05 s"``, ``"1.2 h"``."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{seconds / 3600:.1f} h"


class MatrixProgress:
    def __init__(self, total_cells: int, stream: TextIO | None = None, *,
                 clock: Callable[[], float] = time.monotonic, tty: bool | None = None) -> None:
        self.total_cells = total_cells
        self.stream = sys.stderr if stream is None else stream  # looked up now, not at import
        self.clock = clock
        self.tty = _isatty(self.stream) if tty is None else tty
        self._cell_durations: list[float] = []
        self._index, self._name, self._cell_t0 = 0, "", 0.0
        self._in_cell = False
        self._phase: str | None = None
        self._total: int | None = None
        self._done, self._phase_t0 = 0, 0.0
        self._milestone = 0  # MILESTONES already logged in this phase
        self._last_write = float("-inf")
        self._drawn = 0  # length of the line drawn in place, to blank it out

    def cell(self, index: int, name: str) -> None:
        """Cell ``index`` (1-based) of ``total_cells`` starts."""
        self._index, self._name, self._cell_t0 = index, name, self.clock()
        self._in_cell, self._phase = True, None
        self._write(self._line())

    def phase(self, name: str, total_steps: int | None) -> None:
        """A measurement of the current cell starts: ``"ingest-only"``, ``"compute-only"``, ``"real run"``."""
        self._phase, self._total, self._done = name, total_steps, 0
        self._phase_t0 = self.clock()
        self._milestone = 0
        self._write(self._line())

    def step(self, done: int) -> None:
        """``done`` steps of the current phase are finished."""
        self._done = done
        now = self.clock()
        if self.tty:
            if now - self._last_write >= REDRAW_S or done == self._total:
                self._write(self._line())
            return
        reached = self._milestone
        if self._total:
            while reached < len(MILESTONES) and done >= MILESTONES[reached] * self._total:
                reached += 1
        if reached > self._milestone or now - self._last_write >= HEARTBEAT_S:
            self._milestone = reached
            self._write(self._line())

    def end_cell(self, summary: str) -> None:
        """The cell's last line, kept on screen: its duration, ``summary`` and the matrix ETA."""
        took = self.clock() - self._cell_t0
        self._cell_durations.append(took)
        self._in_cell, self._phase = False, None
        parts = [f"cell {self._index}/{self.total_cells} {self._name} done in {fmt_duration(took)}"]
        if summary:
            parts.append(summary)
        eta = self._matrix_eta()
        if eta is not None and len(self._cell_durations) < self.total_cells:
            parts.append(f"matrix ETA {fmt_duration(eta)}")
        self._write(" | ".join(parts), final=True)

    def _line(self) -> str:
        parts = [f"cell {self._index}/{self.total_cells} {self._name}"]
        if self._phase is not None:
            steps = f"{self._done}/{self._total}" if self._total is not None else f"{self._done}"
            elapsed = self.clock() - self._phase_t0
            parts += [f"{self._phase} {steps} steps", f"{fmt_duration(elapsed)} elapsed"]
            if self._total is not None and self._done > 0:
                left = max(self._total - self._done, 0)
                parts.append(f"phase ETA {fmt_duration(left * elapsed / self._done)}")
        eta = self._matrix_eta()
        if eta is not None:
            parts.append(f"matrix ETA {fmt_duration(eta)}")
        return " | ".join(parts)

    def _matrix_eta(self) -> float | None:
        """Mean finished cell x cells left, less what the running cell has already taken (up to
        the mean: a cell running long is assumed about to end)."""
        if not self._cell_durations:
            return None
        mean = sum(self._cell_durations) / len(self._cell_durations)
        left = self.total_cells - len(self._cell_durations)
        spent = min(self.clock() - self._cell_t0, mean) if self._in_cell else 0.0
        return max(left * mean - spent, 0.0)

    def _write(self, line: str, final: bool = False) -> None:
        self._last_write = self.clock()
        if self.tty:
            self.stream.write("\r" + line.ljust(self._drawn) + ("\n" if final else ""))
            self._drawn = 0 if final else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


class NullProgress:
    """The same calls, showing nothing: for library callers."""

    def cell(self, index: int, name: str) -> None:
        pass

    def phase(self, name: str, total_steps: int | None) -> None:
        pass

    def step(self, done: int) -> None:
        pass

    def end_cell(self, summary: str) -> None:
        pass


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
