"""`MatrixProgress` with a fake clock: every figure in the lines worked out by hand."""
from __future__ import annotations

import io

import pytest

from trainfeed.converters.progress import MatrixProgress, NullProgress, fmt_duration


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(total_cells: int, tty: bool) -> tuple[MatrixProgress, io.StringIO, Clock]:
    stream, clock = io.StringIO(), Clock()
    return MatrixProgress(total_cells, stream, clock=clock, tty=tty), stream, clock


@pytest.mark.parametrize("seconds, text", [
    (0, "0 s"), (14.4, "14 s"), (59.6, "1 min 00 s"), (125, "2 min 05 s"), (3599.4, "59 min 59 s"),
    (3600, "1.0 h"), (4320, "1.2 h"),
])
def test_fmt_duration(seconds, text):
    assert fmt_duration(seconds) == text


def test_log_lines_with_hand_worked_figures():
    p, stream, clock = make(3, tty=False)
    p.cell(1, "blob x t4 torch")
    p.phase("ingest-only", 400)
    for done in range(1, 401):  # 0.25 s a step: 100 s
        clock.t = done * 0.25
        p.step(done)
    clock.t = 125.0
    p.end_cell("ingest 4.0/s")
    # mean cell 125 s x 2 cells left = 250 s; 60 s into cell 2 it is 190 s
    p.cell(2, "blob x cpu torch")
    p.phase("real run", 10)
    clock.t = 185.0
    p.step(5)  # past 25% and 50% at once: one line
    assert stream.getvalue().splitlines() == [
        "cell 1/3 blob x t4 torch",
        "cell 1/3 blob x t4 torch | ingest-only 0/400 steps | 0 s elapsed",
        "cell 1/3 blob x t4 torch | ingest-only 100/400 steps | 25 s elapsed | phase ETA 1 min 15 s",
        "cell 1/3 blob x t4 torch | ingest-only 200/400 steps | 50 s elapsed | phase ETA 50 s",
        "cell 1/3 blob x t4 torch | ingest-only 300/400 steps | 1 min 15 s elapsed | phase ETA 25 s",
        "cell 1/3 blob x t4 torch | ingest-only 400/400 steps | 1 min 40 s elapsed | phase ETA 0 s",
        "cell 1/3 blob x t4 torch done in 2 min 05 s | ingest 4.0/s | matrix ETA 4 min 10 s",
        "cell 2/3 blob x cpu torch | matrix ETA 4 min 10 s",
        "cell 2/3 blob x cpu torch | real run 0/10 steps | 0 s elapsed | matrix ETA 4 min 10 s",
        "cell 2/3 blob x cpu torch | real run 5/10 steps | 1 min 00 s elapsed | phase ETA 1 min 00 s"
        " | matrix ETA 3 min 10 s",
    ]


def test_matrix_eta_of_a_cell_running_past_the_mean_and_of_the_last_cell():
    p, stream, clock = make(2, tty=False)
    p.cell(1, "a")
    clock.t = 10.0
    p.end_cell("")
    p.cell(2, "b")
    clock.t = 40.0  # 30 s into a cell whose mean is 10 s: only the cell itself is left, about to end
    p.phase("real run", None)
    clock.t = 50.0
    p.end_cell("done")
    assert stream.getvalue().splitlines()[-2:] == [
        "cell 2/2 b | real run 0 steps | 0 s elapsed | matrix ETA 0 s",
        "cell 2/2 b done in 40 s | done",  # the matrix is finished: no ETA
    ]


def test_log_is_bounded_however_many_steps():
    p, stream, clock = make(1, tty=False)
    p.cell(1, "a")
    p.phase("ingest-only", 10_000)
    for done in range(1, 10_001):
        clock.t = done * 0.005
        p.step(done)
    p.end_cell("")
    assert len(stream.getvalue().splitlines()) == 1 + 1 + 4 + 1


def test_log_heartbeat_when_steps_are_unknown():
    p, stream, clock = make(1, tty=False)
    p.cell(1, "a")
    p.phase("compute-only", None)
    for second in range(1, 151):
        clock.t = float(second)
        p.step(second)
    lines = stream.getvalue().splitlines()
    assert lines[2:] == ["cell 1/1 a | compute-only 60 steps | 1 min 00 s elapsed",
                         "cell 1/1 a | compute-only 120 steps | 2 min 00 s elapsed"]


def test_tty_redraws_one_line_throttled():
    p, stream, clock = make(2, tty=True)
    p.cell(1, "blob x t4 torch")
    p.phase("ingest-only", 1000)
    for done in range(1, 1001):  # 10 s of steps at 100/s
        clock.t = done * 0.01
        p.step(done)
    drawn = stream.getvalue()
    assert "\n" not in drawn
    draws = drawn.split("\r")[1:]
    assert 10 / 0.25 <= len(draws) <= 10 / 0.25 + 3  # cell, phase, every 0.25 s, the last step
    assert draws[-1].rstrip() == ("cell 1/2 blob x t4 torch | ingest-only 1000/1000 steps | 10 s elapsed"
                                  " | phase ETA 0 s")
    assert "ingest-only 500/1000 steps | 5 s elapsed | phase ETA 5 s" in drawn
    clock.t = 12.0
    p.end_cell("ok")
    last = stream.getvalue().split("\r")[-1]
    # a full line, blanked out to the width of the longer line it replaces
    assert last.endswith("\n") and last.rstrip() == "cell 1/2 blob x t4 torch done in 12 s | ok | matrix ETA 12 s"
    assert len(last) == len(draws[-1]) + 1


def test_stderr_only(capsys):
    p = MatrixProgress(2)
    p.cell(1, "a")
    p.phase("real run", 4)
    p.step(4)
    p.end_cell("ok")
    null = NullProgress()
    null.cell(2, "b")
    null.phase("real run", 4)
    null.step(4)
    null.end_cell("ok")
    out, err = capsys.readouterr()
    assert out == ""
    assert "cell 1/2 a | real run 4/4 steps" in err and err.count("cell 2/2") == 0
