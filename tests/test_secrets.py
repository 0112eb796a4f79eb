"""No secret leaves trainfeed: planted SAS tokens, URL user info and an Azure account key (Azurite's
development key: it is the account key, a secret to the code that handles it) are searched for
in everything the real console commands print and write. The commands run as subprocesses, as
a user runs them, so nothing registered by an earlier test can mask a leak."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import write_volumes

REPO = Path(__file__).resolve().parent.parent
AZ = "secrets"  # container on the test Azurite


def account_key_parts() -> tuple[str, ...]:
    """The key, and its longest run before a character that URL-encoding would change."""
    from trainfeed.benchmarks.emulators.azurite import ACCOUNT_KEY

    return ACCOUNT_KEY, ACCOUNT_KEY.split("/")[0]


def command(module: str, *args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def files_under(*roots: Path) -> dict[str, bytes]:
    """Every file at or under ``roots``, read whole."""
    out = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        out.update((str(p), p.read_bytes()) for p in paths)
    return out


def assert_no_secret(secrets, run: subprocess.CompletedProcess, files: dict[str, bytes] | None = None) -> None:
    places = {"stdout": run.stdout.encode(), "stderr": run.stderr.encode(), **(files or {})}
    leaks = [(secret, where) for secret in secrets for where, data in places.items() if secret.encode() in data]
    assert leaks == [], leaks


@pytest.fixture(scope="module")
def remote(azurite_server, tmp_path_factory):
    """10 volumes and their labels at abfs://secrets/vols, one of them a truncated .npy."""
    import fsspec

    src = tmp_path_factory.mktemp("secret-src") / "vols"
    write_volumes(src, 10, shape=(4, 4, 2))
    (src / "v009.npy").write_bytes((src / "v009.npy").read_bytes()[:100])
    fs = fsspec.filesystem("abfs", **azurite_server.storage_options)
    fs.mkdir(AZ)
    fs.put(str(src), f"{AZ}/vols", recursive=True)
    return {"src": src, "conn": azurite_server.connection_string}


# ------------------------------------------------------------------ (a) convert, failing runs

@pytest.mark.azurite
@pytest.mark.parametrize("src, labels, secret, shown", [
    (f"abfs://{AZ}/missing?sv=2024-01-01&sig=PLANTED1", None, "PLANTED1", f"abfs://{AZ}/missing?***"),
    ("abfs://user:PLANTED2@missing/vols", None, "PLANTED2", "abfs://missing/vols"),
    (f"abfs://{AZ}/vols", f"abfs://{AZ}/none.csv?sv=2024-01-01&sig=PLANTED3", "PLANTED3", f"abfs://{AZ}/none.csv?***"),
    (f"abfs://{AZ}/vols", f"abfs://user:PLANTED4@{AZ}/none.csv", "PLANTED4", f"abfs://{AZ}/none.csv"),
], ids=["sas-in-src", "userinfo-in-src", "sas-in-labels", "userinfo-in-labels"])
def test_convert_failures_print_no_secret(remote, tmp_path, src, labels, secret, shown):
    res = command("trainfeed.converters", src, tmp_path / "out", "--to", "parquet", "--no-progress",
                  "--storage-option", f"connection_string={remote['conn']}", *(["--labels", labels] if labels else []),
                  cwd=tmp_path)
    assert res.returncode in (1, 2) and res.stderr.startswith("error: ") and "Traceback" not in res.stderr
    assert shown in res.stderr  # the location is named, without its secret
    assert_no_secret([secret, *account_key_parts()], res, files_under(tmp_path))


# ------------------------------------------------------------------ (b) convert, succeeding runs

@pytest.mark.azurite
@pytest.mark.parametrize("fmt, dst_name, credentials", [
    ("parquet", "out.parquet", "option"), ("delta", "out.delta", "environment"), ("hdf5", "out.h5", "option"),
])
def test_converted_store_summary_and_rejects_hold_no_secret(remote, tmp_path, fmt, dst_name, credentials):
    by_option = ["--storage-option", f"connection_string={remote['conn']}"] if credentials == "option" else []
    env = {"AZURE_STORAGE_CONNECTION_STRING": remote["conn"]} if credentials == "environment" else {}
    res = command("trainfeed.converters", f"abfs://{AZ}/vols", tmp_path / dst_name, "--to", fmt, "--labels",
                  f"abfs://{AZ}/vols/labels.csv", "--on-error", "skip", "--json", "--no-progress", *by_option,
                  cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert (summary["samples"], summary["rejected"], summary["source"]) == (9, 1, f"abfs://{AZ}/vols")
    rejects = [json.loads(line) for line in Path(summary["rejects_report"]).read_text().splitlines()]
    assert [r["id"] for r in rejects] == ["v009"]
    assert_no_secret(account_key_parts(), res, files_under(tmp_path))


# ------------------------------------------------------------------ (c) train, failing runs

@pytest.mark.azurite
@pytest.mark.parametrize("data, labels, secret, shown", [
    (f"abfs://{AZ}/missing?sv=2024-01-01&sig=PLANTED5", None, "PLANTED5", f"abfs://{AZ}/missing?***"),
    ("abfs://user:PLANTED6@missing/vols", None, "PLANTED6", "abfs://missing/vols"),
    (f"abfs://{AZ}/vols", f"abfs://{AZ}/none.csv?sv=2024-01-01&sig=PLANTED7", "PLANTED7", f"abfs://{AZ}/none.csv?***"),
], ids=["sas-in-data", "userinfo-in-data", "sas-in-labels"])
def test_train_failures_print_and_write_no_secret(remote, tmp_path, data, labels, secret, shown):
    res = command("trainfeed.training", "--data", data, "--format", "blob", "--out", tmp_path / "out", "--no-progress",
                  "--storage-option", f"connection_string={remote['conn']}", *(["--labels", labels] if labels else []),
                  cwd=tmp_path)
    assert res.returncode in (1, 2) and res.stderr.startswith("error: ") and "Traceback" not in res.stderr
    assert shown in res.stderr
    assert_no_secret([secret, *account_key_parts()], res, files_under(tmp_path))


# ------------------------------------------------------------------ (d) storage-bench

BENCH_TINY = ["--width", "4", "--batch-size", "4", "--steps", "2", "--cpu-steps", "2", "--workers", "2"]


@pytest.fixture(scope="module")
def clean_remote(remote, azurite_server, tmp_path_factory):
    """8 valid volumes at abfs://secrets/clean (a matrix run has no --on-error skip)."""
    import fsspec

    src = tmp_path_factory.mktemp("secret-clean") / "clean"
    write_volumes(src, 8, shape=(4, 4, 2))
    fsspec.filesystem("abfs", **azurite_server.storage_options).put(str(src), f"{AZ}/clean", recursive=True)
    return src


@pytest.mark.azurite
@pytest.mark.slow
def test_storage_bench_on_azurite_prints_and_writes_no_key(remote, clean_remote, tmp_path):
    out = tmp_path / "ab"
    res = command("trainfeed.benchmarks.cli", "run", f"abfs://{AZ}/clean", "--labels", f"abfs://{AZ}/clean/labels.csv",
                  "--storage-option", f"connection_string={remote['conn']}", "--out", out, "--nodes", "cpu,t4",
                  "--stores", "blob,parquet", "--json", *BENCH_TINY, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["cells"] == 4
    written = files_under(out)
    assert {"report.md", "report.html", "results.csv", "results.jsonl", "_trainfeed.json", "summary.json"} <= {
        Path(p).name for p in written}
    assert_no_secret(account_key_parts(), res, written)


@pytest.mark.azurite
def test_storage_bench_failing_on_a_sas_url_prints_and_writes_no_secret(remote, tmp_path):
    out = tmp_path / "ab"
    res = command("trainfeed.benchmarks.cli", "run", f"abfs://{AZ}/missing?sv=2024-01-01&sig=PLANTED8", "--out", out,
                  "--storage-option", f"connection_string={remote['conn']}", "--nodes", "t4",
                  "--stores", "blob,parquet", *BENCH_TINY, cwd=tmp_path)
    assert res.returncode == 1 and "no cell was measured: all 2 failed" in res.stderr
    report = (out / "report.md").read_text()
    # the small files cannot be staged (copied to the local backend): both stores fail with that reason
    assert report.count(f"abfs://{AZ}/missing?***: not found, or an empty folder") == 2
    assert_no_secret(["PLANTED8", *account_key_parts()], res, files_under(out))


@pytest.mark.azurite
@pytest.mark.slow
def test_storage_bench_own_azurite_backend_writes_no_key(tmp_path):
    src = tmp_path / "vols"
    write_volumes(src, 8, shape=(4, 4, 2))
    out = tmp_path / "ab"
    res = command("trainfeed.benchmarks.cli", "run", src, "--storage-backend", "azurite", "--out", out, "--nodes", "t4",
                  "--stores", "blob", "--json", *BENCH_TINY, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["cells"] == 1
    assert_no_secret(account_key_parts(), res, files_under(out))
