"""Issue #30: many ranks, one order. Real ranks (processes with a gloo process group and an
``all_reduce`` at every step) read a store through DataLoaders with worker processes: every
rank steps through the same number of batches, the samples of each global batch do not depend
on the number of ranks or workers, and a position saved on one topology resumes on another,
every sample exactly once. A hang fails the test (a deadline on every job)."""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

import trainfeed
from tests.test_object_storage import get_backend, on
from tests.training.ranks import digest, run_rank
from trainfeed.benchmarks.emulators.localserver import free_port

torch = pytest.importorskip("torch")

G = 12  # global batch: world sizes 1, 2, 3, 4 and 6 share it evenly
DEADLINE = 240  # seconds a job of ranks may take; a hang fails the test


def start(world: int, job: dict, method: str = "fork") -> list[dict]:
    """``world`` ranks of ``job`` (ranks.run_rank), started as torch.multiprocessing starts them."""
    import torch.multiprocessing as mp

    job = {**job, "port": free_port()}
    ctx = mp.start_processes(run_rank, args=(world, job), nprocs=world, join=False, start_method=method)
    deadline = time.monotonic() + DEADLINE
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} ranks did not finish in {DEADLINE} s: a hang")
    return [json.loads(Path(job["out"].format(rank=r)).read_text()) for r in range(world)]


def reference(store, **kw) -> list[list[str]]:
    """Each global batch's samples, read by one process alone."""
    return [sorted(digest(r) for r in b.x[:len(b.ids) - b.padding].reshape(len(b.ids) - b.padding, -1))
            for b in store.batches(global_batch_size=G, **kw)]


def per_global_batch(ranks: list[dict]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for r in ranks:
        for b in r["batches"]:
            out.setdefault(b["batch"], []).extend(b["rows"])
    return {k: sorted(v) for k, v in out.items()}


def store_on(request, tmp_path, source, backend: str):
    """The source as a Parquet store of 7 row groups on ``backend``: (store, url, storage options)."""
    root, _ = source
    if backend == "local":
        url, options = str(tmp_path / "s.parquet"), {}
    else:
        b = get_backend(request, backend)
        url, options = b.url(b.new_bucket("ranks"), "s.parquet"), dict(b.options)
    trainfeed.convert(str(root), url, format="parquet", labels=str(root / "labels.csv"), storage_options=options,
                      row_group_size=8 * 128)
    return trainfeed.open_store(url, storage_options=options), url, options


@pytest.mark.parametrize("backend", ["local", on("s3")])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_rank_steps_through_the_same_global_batches(request, tmp_path, source, backend, world):
    store, url, options = store_on(request, tmp_path, source, backend)
    ranks = start(world, {"url": url, "options": options, "global_batch": G, "workers": 2, "method": "fork",
                          "out": str(tmp_path / "rank{rank}.json")})
    want = reference(store)
    assert [len(r["batches"]) for r in ranks] == [len(want)] * world  # the same number of steps on every rank
    sizes = {b["size"] for r in ranks for b in r["batches"][:-1 if world == 1 else None]}
    assert sizes == {G // world}  # full batches (several ranks: the last one padded; one alone: it is short)
    assert all(b["step_total"] == [len(want_k), world] for r in ranks for b, want_k in zip(r["batches"], want))
    assert per_global_batch(ranks) == dict(enumerate(want))  # global batch k: the same samples on any world
    everything = sorted(d for batch in want for d in batch)
    assert everything == sorted(digest(np.frombuffer(s, np.float32)) for s, _ in source[1])  # each sample once


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_ranks_started_without_the_environment_tell_spawned_workers_their_rank(request, tmp_path, source, method):
    """``torch.multiprocessing.spawn`` passes rank and world size to ``init_process_group``,
    not through RANK / WORLD_SIZE: the dataset takes them in the training process and carries
    them to its workers, whatever their start method (before, every sample came twice)."""
    store, url, _options = store_on(request, tmp_path, source, "local")
    ranks = start(2, {"url": url, "global_batch": G, "workers": 2, "method": method,
                      "out": str(tmp_path / "rank{rank}.json")}, method="spawn")
    assert per_global_batch(ranks) == dict(enumerate(reference(store)))


@pytest.mark.parametrize("backend", ["local", on("s3")])
@pytest.mark.parametrize("before,after", [((4, 2), (2, 1)), ((4, 2), (1, 0)), ((4, 2), (3, 4)), ((2, 1), (4, 2))])
def test_a_position_saved_on_one_topology_resumes_on_another(request, tmp_path, source, backend, before, after):
    """A state saved by ranks x workers ``before`` loads on ``after`` and goes on at the next
    global batch: across the two runs, every sample of the epoch once, each global batch the
    same samples as one process alone reads."""
    store, url, options = store_on(request, tmp_path, source, backend)
    job = {"url": url, "options": options, "global_batch": G, "seed": 4, "epoch": 1}
    first = start(before[0], {**job, "workers": before[1], "method": "fork", "stop_after": 2,
                              "out": str(tmp_path / "a{rank}.json")})
    states = [r["state"] for r in first]
    assert states[0]["batch"] == 2 and all(s == states[0] for s in states)  # the same position on every rank
    second = start(after[0], {**job, "workers": after[1], "method": "fork", "state": states[0],
                              "out": str(tmp_path / "b{rank}.json")})
    got = per_global_batch(first + second)
    want = dict(enumerate(reference(store, seed=4, epoch=1)))
    assert got == want
    delivered = sorted(d for rows in got.values() for d in rows)
    assert len(delivered) == len(set(delivered)) == len(source[1])


@pytest.mark.s3
def test_ranks_together_read_no_more_bytes_than_one_rank(request, tmp_path):
    """W ranks on one machine reading their parts fetch what one process reading everything
    fetches, save the pieces split between two ranks' lanes (at most W - 1 per epoch), counted
    by a relay in front of the S3 server (what the server answered)."""
    from tests.conftest import write_volumes
    from trainfeed.benchmarks.emulators.latency import LatencyRelay

    write_volumes(tmp_path / "src", 160, shape=(4, 4, 2), seed=3)
    backend = get_backend(request, "s3")
    url = backend.url(backend.new_bucket("bytes"), "s.parquet")
    trainfeed.convert(str(tmp_path / "src"), url, format="parquet", labels=str(tmp_path / "src" / "labels.csv"),
                      storage_options=dict(backend.options), row_group_size=8 * 128)
    with LatencyRelay(request.getfixturevalue("s3_server").port, 0.0) as relay:
        options = {**backend.options, "endpoint_url": f"http://127.0.0.1:{relay.port}"}
        store = trainfeed.open_store(url, storage_options=options)  # the ranks inherit it, listing and footers
        piece = max(store.reader.format.piece_span(store.reader.listing, p)[2]
                    - store.reader.format.piece_span(store.reader.listing, p)[1] for p in store.reader.pieces)
        answered = {}
        for world in (1, 2, 4):
            before = relay.answered
            start(world, {"store": store, "global_batch": 16, "workers": 1, "method": "fork",
                          "out": str(tmp_path / f"w{world}-{{rank}}.json")})
            answered[world] = relay.answered - before
    assert answered[1] > 0
    for world in (2, 4):
        assert answered[world] <= answered[1] + (world - 1) * piece, (answered, piece)


# ------------------------------------------------------------------ launchers

REPO = Path(__file__).resolve().parents[2]


def ddp_recipe() -> str:
    """The README's multi-GPU script, as written."""
    text = (REPO / "README.md").read_text()
    return text.split("```python\n# ddp.py: torchrun", 1)[1].split("```", 1)[0].split("\n", 1)[1]


def torchrun(n: int, *args: str, cwd: Path, timeout: float = DEADLINE):
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port",
               str(free_port()), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def recipe_lines(output: str) -> dict[int, list[str]]:
    """What each rank of the recipe printed: rank -> its epoch lines (the ranks' lines may
    interleave on the shared output)."""
    import re

    lines: dict[int, list[str]] = {}
    for rank, rest in re.findall(r"rank (\d+): (epoch \d+, \d+ steps of \d+ samples)", output):
        lines.setdefault(int(rank), []).append(rest)
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_the_readme_recipe_runs_under_torchrun(tmp_path, source, n):
    store, url, _ = store_on(None, tmp_path, source, "local")
    (tmp_path / "ddp.py").write_text(ddp_recipe())
    done = torchrun(n, "ddp.py", url, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    per_rank = recipe_lines(done.stdout)
    steps = -(-store.samples // 48)
    assert per_rank == {r: [f"epoch {e}, {steps} steps of {48 // n} samples" for e in (0, 1)] for r in range(n)}
    # run again: it finds the checkpoint of the finished run and has nothing left to do
    again = torchrun(n, "ddp.py", url, cwd=tmp_path)
    assert again.returncode == 0 and recipe_lines(again.stdout) == {r: [f"epoch 1, {steps} steps of {48 // n} samples"]
                                                                    for r in range(n)}


@pytest.mark.slow
@pytest.mark.spark
def test_the_readme_recipe_runs_under_torch_distributor(tmp_path, source, monkeypatch):
    from pyspark.ml.torch.distributor import TorchDistributor

    from trainfeed.pipelines.spark import get_spark

    store, url, _ = store_on(None, tmp_path, source, "local")
    (tmp_path / "ddp.py").write_text(ddp_recipe())
    monkeypatch.chdir(tmp_path)
    get_spark("trainfeed-ddp-recipe")
    TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(str(tmp_path / "ddp.py"), url)
    saved = torch.load(tmp_path / "ddp-checkpoint.pt", weights_only=True)  # rank 0's, after the last step
    steps = -(-store.samples // 48)
    assert (saved["data"]["epoch"], saved["data"]["batch"], saved["data"]["global_batch_size"]) == (1, steps, 48)


@pytest.mark.slow
def test_a_rank_killed_mid_epoch_fails_the_run_and_fewer_ranks_resume_exactly(tmp_path, source):
    """torchrun, 2 ranks: rank 1 is SIGKILLed at batch 3 (a node lost). Rank 0 fails at its next
    collective and torchrun ends the run, in bounded time; one rank then resumes from rank 0's
    last saved position: across the two runs, every sample of the epoch once."""
    store, url, _ = store_on(None, tmp_path, source, "local")
    job = {"url": url, "global_batch": G, "workers": 2, "method": "fork", "epoch": 0,
           "checkpoint": str(tmp_path / "position.json"), "log": str(tmp_path / "run1-{rank}.jsonl"),
           "out": str(tmp_path / "run1-{rank}.json"), "die": [1, 3], "collective_timeout": 60}
    (tmp_path / "job1.json").write_text(json.dumps(job))
    started = time.monotonic()
    first = torchrun(2, str(REPO / "tests" / "training" / "ranks.py"), str(tmp_path / "job1.json"), cwd=tmp_path)
    assert first.returncode != 0 and time.monotonic() - started < 120
    assert "exitcode  : -9" in first.stderr or "Signal 9" in first.stderr, first.stderr[-3000:]
    position = json.loads((tmp_path / "position.json").read_text())
    assert position["batch"] == 3  # batches 0, 1, 2 done on both ranks
    done = [json.loads(line) for line in (tmp_path / "run1-0.jsonl").read_text().splitlines()]
    done = [b for b in done if b["batch"] < position["batch"]]
    done += [json.loads(line) for line in (tmp_path / "run1-1.jsonl").read_text().splitlines()
             if json.loads(line)["batch"] < position["batch"]]
    resume = {**job, "die": None, "state": position, "log": None, "out": str(tmp_path / "run2-{rank}.json")}
    (tmp_path / "job2.json").write_text(json.dumps(resume))
    second = torchrun(1, str(REPO / "tests" / "training" / "ranks.py"), str(tmp_path / "job2.json"), cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    rest = json.loads((tmp_path / "run2-0.json").read_text())["batches"]
    got = per_global_batch([{"batches": done}, {"batches": rest}])
    assert got == dict(enumerate(reference(store)))
    delivered = [d for rows in got.values() for d in rows]
    assert len(delivered) == len(set(delivered)) == len(source[1])


@pytest.mark.slow
def test_train_loses_a_rank_then_resumes_on_fewer_processes(tmp_path, source):
    """`train` under torchrun, 2 processes, DDP over gloo: rank 1 is SIGKILLed mid-run. Rank 0
    stops at its next collective with a message saying what happened and how to go on; `train
    --resume` on one process goes on from the checkpoint with the same global batch, to the end."""
    import os
    import signal
    import subprocess
    import sys

    _, url, _ = store_on(None, tmp_path, source, "local")  # 56 samples: 7 steps of 8 an epoch
    ck, out = tmp_path / "ck", tmp_path / "out"
    args = ["-m", "trainfeed.training", "--data", url, "--width", "4", "--global-batch-size", "8", "--epochs", "20",
            "--checkpoint-dir", str(ck), "--checkpoint-every", "1", "--out", str(out), "--no-progress", "--json"]
    run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                            str(free_port()), *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    deadline = time.monotonic() + DEADLINE
    log = out / "steps-rank1.jsonl"
    while not (log.exists() and len(log.read_text().splitlines()) >= 4):
        assert run.poll() is None and time.monotonic() < deadline, "the run ended before rank 1 could be killed"
        time.sleep(0.2)
    victim = [int(p) for p in os.listdir("/proc") if p.isdigit() and _rank_of(int(p)) == "1"
              and str(url) in _cmdline(int(p))]
    assert len(victim) == 1
    os.kill(victim[0], signal.SIGKILL)
    killed = time.monotonic()
    _, err = run.communicate(timeout=120)
    assert run.returncode != 0 and time.monotonic() - killed < 120
    assert "rank 0 of 2: a collective with the other ranks failed, another rank of this run stopped" in err, err[-3000:]
    saved = torch.load(ck / "checkpoint.pt", weights_only=True)
    resumed = subprocess.run([sys.executable, *args, "--resume"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=DEADLINE)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads(resumed.stdout)
    assert summary["resumed_from_step"] == saved["global_step"] > 0
    assert summary["global_step"] == 20 * 7 and summary["global_batch_size"] == 8 and summary["world_size"] == 1


def _rank_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((e[5:].decode() for e in env if e.startswith(b"RANK=")), None)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
