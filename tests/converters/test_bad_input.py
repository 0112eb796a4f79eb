"""Every bad input: a message naming the file and the problem, exit 1 (2 for usage), and
nothing lost: no store left behind, an existing store untouched."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import write_images, write_volumes
from trainfeed.converters.formats import parquet

FORMATS = [("parquet", "out.parquet"), ("delta", "out.delta"), ("hdf5", "out.h5")]


def tree_digest(path: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``path`` (or of the file itself)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if name in p.name)


def corrupt_truncated(src: Path) -> Path:
    bad = src / "v007.npy"
    bad.write_bytes(bad.read_bytes()[:100])
    return bad


def corrupt_garbage(src: Path) -> Path:
    bad = src / "v007.npy"
    bad.write_bytes(b"this is not a numpy file at all" * 10)
    return bad


def corrupt_shape(src: Path) -> Path:
    bad = src / "v007.npy"
    np.save(bad, np.zeros((6, 5, 4, 2), np.float32))
    return bad


def corrupt_dtype(src: Path) -> Path:
    bad = src / "v007.npy"
    np.save(bad, np.zeros((6, 5, 4, 3), np.float64))
    return bad


def corrupt_empty(src: Path) -> Path:
    bad = src / "v007.npy"
    bad.write_bytes(b"")
    return bad


def corrupt_unreadable(src: Path) -> Path:
    bad = src / "v007.npy"
    bad.unlink()
    bad.symlink_to(src / "gone" / "nowhere.npy")  # readable by nobody, root included
    return bad


def corrupt_pickled(src: Path) -> Path:
    bad = src / "v007.npy"
    np.save(bad, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return bad


CASES = {
    "truncated": (corrupt_truncated, "corrupt or truncated .npy"),
    "garbage": (corrupt_garbage, "corrupt or truncated .npy"),
    "shape": (corrupt_shape, "has shape (6, 5, 4, 2), but the first sample 'v000' has (6, 5, 4, 3)"),
    "dtype": (corrupt_dtype, "has dtype float64, but the first sample 'v000' has float32"),
    "zero-byte": (corrupt_empty, "empty file (0 bytes)"),
    "unreadable": (corrupt_unreadable, "cannot read: file not found"),
    "pickled": (corrupt_pickled, "pickled object array"),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("fmt,name", FORMATS)
def test_bad_file_fails_naming_it_and_leaves_nothing(tmp_path, convert_cli, case, fmt, name):
    src = tmp_path / "vols"
    write_volumes(src, 12)
    corrupt, message = CASES[case]
    bad = corrupt(src)
    res = convert_cli(src, tmp_path / name, "--to", fmt, "--labels", src / "labels.csv")
    assert res.exit_code == 1
    assert str(bad) in res.stderr and message in res.stderr
    assert leftovers(tmp_path, "out") == []  # no store, no staging folder


@pytest.mark.parametrize("case", sorted(CASES))
def test_skip_converts_the_rest_and_reports_rejects(tmp_path, convert_cli, case):
    src = tmp_path / "vols"
    truth = write_volumes(src, 12)
    corrupt, message = CASES[case]
    bad = corrupt(src)
    dst = tmp_path / "out.parquet"
    res = convert_cli(src, dst, "--to", "parquet", "--labels", src / "labels.csv", "--on-error", "skip",
                      "--verify", "--json")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["samples"] == 11 and summary["rejected"] == 1
    rejects = [json.loads(line) for line in Path(summary["rejects_report"]).read_text().splitlines()]
    assert rejects == [{"file": str(bad), "id": "v007", "reason": rejects[0]["reason"]}]
    assert message in rejects[0]["reason"]
    stored = {sid: f["volume"] for sid, _, f in parquet.read_samples(dst)}
    assert set(stored) == set(truth) - {"v007"}
    assert all(np.array_equal(stored[sid], truth[sid][0]) for sid in stored)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied(tmp_path, convert_cli):
    src = tmp_path / "vols"
    write_volumes(src, 4)
    (src / "v002.npy").chmod(0)
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet")
    assert res.exit_code == 1 and "v002.npy: cannot read: permission denied" in res.stderr


@pytest.mark.parametrize("fmt,name", FORMATS)
def test_undecodable_image(tmp_path, convert_cli, fmt, name):
    src = tmp_path / "imgs"
    write_images(src, 6)
    bad = src / "b" / "img003.jpg"
    bad.write_bytes(bad.read_bytes()[:40])  # header only: PIL identifies it, decoding fails
    garbage = src / "a" / "img004.jpg"
    garbage.write_bytes(b"\x00" * 500)
    res = convert_cli(src, tmp_path / name, "--to", fmt)
    assert res.exit_code == 1 and str(garbage) in res.stderr and "undecodable image" in res.stderr
    res = convert_cli(src, tmp_path / name, "--to", fmt, "--on-error", "skip", "--json")
    assert res.exit_code == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["samples"] == 4 and summary["rejected"] == 2
    reasons = {json.loads(line)["file"]: json.loads(line)["reason"]
               for line in Path(summary["rejects_report"]).read_text().splitlines()}
    assert set(reasons) == {str(bad), str(garbage)}
    assert all(r.startswith("undecodable image") for r in reasons.values())


def test_images_of_different_sizes_need_resize_when_decoded(tmp_path, convert_cli):
    src = tmp_path / "imgs"
    write_images(src, 4, size=(20, 30))
    write_images(tmp_path / "other", 1, size=(21, 30))
    (tmp_path / "other" / "a" / "img000.jpg").rename(src / "a" / "odd.jpg")
    res = convert_cli(src, tmp_path / "o.h5", "--to", "hdf5", "--image-storage", "decoded")
    assert res.exit_code == 1 and "odd.jpg" in res.stderr and "--resize" in res.stderr
    res = convert_cli(src, tmp_path / "o.h5", "--to", "hdf5", "--image-storage", "decoded", "--resize", "20x30",
                      "--verify")
    assert res.exit_code == 0, res.stderr


def test_empty_source_folder(tmp_path, convert_cli):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.txt").write_text("no samples here")
    res = convert_cli(tmp_path / "empty", tmp_path / "o.parquet", "--to", "parquet")
    assert res.exit_code == 1
    assert ("empty" in res.stderr
            and "no .npy, .npz, .jpg, .jpeg or .png files found (1 other files ignored)" in res.stderr)
    assert leftovers(tmp_path, "o.parquet") == []


def test_missing_source_folder(tmp_path, convert_cli):
    res = convert_cli(tmp_path / "nope", tmp_path / "o.parquet", "--to", "parquet")
    assert res.exit_code == 1 and "nope: source folder does not exist" in res.stderr


def test_all_files_rejected_writes_nothing(tmp_path, convert_cli):
    src = tmp_path / "bad"
    src.mkdir()
    for i in range(3):
        (src / f"x{i}.npy").write_bytes(b"")
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet", "--on-error", "skip")
    assert res.exit_code == 1 and "no valid samples (3 rejected" in res.stderr
    assert leftovers(tmp_path, "o.parquet") == []


def test_mixed_sample_kinds(tmp_path, convert_cli):
    src = tmp_path / "mixed"
    write_volumes(src, 3)
    write_images(src, 2)
    res = convert_cli(src, tmp_path / "o.parquet", "--to", "parquet")
    assert res.exit_code == 1 and "mixes sample kinds (2 image, 3 npy)" in res.stderr


@pytest.mark.parametrize("fmt,name", FORMATS)
def test_existing_destination_is_refused_and_untouched(tmp_path, volumes, convert_cli, fmt, name):
    src, _ = volumes
    dst = tmp_path / name
    assert convert_cli(src, dst, "--to", fmt).exit_code == 0
    before = tree_digest(dst)
    res = convert_cli(src, dst, "--to", fmt)
    assert res.exit_code == 1 and f"{dst}: destination already exists; pass --overwrite" in res.stderr
    assert tree_digest(dst) == before


@pytest.mark.parametrize("fmt,name", FORMATS)
def test_failed_overwrite_keeps_the_old_store(tmp_path, convert_cli, fmt, name):
    good, bad = tmp_path / "good", tmp_path / "bad"
    write_volumes(good, 10)
    write_volumes(bad, 10, seed=1)
    corrupt_truncated(bad)
    dst = tmp_path / name
    assert convert_cli(good, dst, "--to", fmt).exit_code == 0
    before = tree_digest(dst)
    res = convert_cli(bad, dst, "--to", fmt, "--overwrite")
    assert res.exit_code == 1 and "v007.npy" in res.stderr
    assert tree_digest(dst) == before
    assert leftovers(tmp_path, name) == [name]


def test_overwrite_replaces_a_store(tmp_path, convert_cli):
    a, b = tmp_path / "a", tmp_path / "b"
    write_volumes(a, 5, seed=1, labels_csv=False)
    truth_b = write_volumes(b, 7, seed=2, labels_csv=False)
    dst = tmp_path / "o.h5"
    assert convert_cli(a, dst, "--to", "hdf5").exit_code == 0
    assert convert_cli(b, dst, "--to", "hdf5", "--overwrite", "--verify").exit_code == 0
    from trainfeed.converters.formats import hdf5
    got = {sid: f["volume"] for sid, _, f in hdf5.read_samples(dst)}
    assert set(got) == set(truth_b) and all(np.array_equal(got[k], truth_b[k][0]) for k in got)
    assert leftovers(tmp_path, "o.h5") == ["o.h5"]


def test_overwrite_refuses_a_folder_that_is_not_a_store(tmp_path, volumes, convert_cli):
    src, _ = volumes
    precious = tmp_path / "my-thesis"
    precious.mkdir()
    (precious / "chapter1.tex").write_text("years of work")
    res = convert_cli(src, precious, "--to", "parquet", "--overwrite")
    assert res.exit_code == 1 and "is not a trainfeed store; refusing to replace it" in res.stderr
    assert (precious / "chapter1.tex").read_text() == "years of work"


def test_verify_failure_publishes_nothing(tmp_path, volumes, monkeypatch):
    """A store that does not match its source is never made visible."""
    from tests.conftest import run_cli
    from trainfeed.converters import verify as verify_mod
    from trainfeed.converters.cli import app

    src, _ = volumes
    real = verify_mod.same_value
    monkeypatch.setattr(verify_mod, "same_value", lambda a, b: False if isinstance(a, np.ndarray) else real(a, b))
    res = run_cli(app, src, tmp_path / "o.parquet", "--to", "parquet", "--verify", "--no-progress")
    assert res.exit_code == 1 and "verification failed" in res.stderr and "field 'volume' differs" in res.stderr
    assert leftovers(tmp_path, "o.parquet") == []


@pytest.mark.parametrize("args,message", [
    (["--to", "parquet", "--mode", "append"], "--mode append works only with --to delta"),
    (["--to", "hdf5", "--compression", "zstd"], "--compression 'zstd' is not available for hdf5"),
    (["--to", "parquet", "--resize", "big"], "--resize expects HEIGHTxWIDTH"),
    (["--to", "parquet", "--target-file-size", "lots"], "--target-file-size: cannot parse 'lots'"),
    (["--to", "parquet", "--optimize"], "--optimize and --vacuum-hours apply to --to delta only"),
    (["--to", "parquet", "--storage-option", "novalue"], "--storage-option expects KEY=VALUE"),
    (["--to", "csv"], "csv"),
    (["--to", "delta", "--overwrite", "--mode", "append"], "contradict"),
])
def test_usage_errors_exit_2(tmp_path, volumes, convert_cli, args, message):
    src, _ = volumes
    res = convert_cli(src, tmp_path / "out", *args)
    assert res.exit_code == 2 and message in (res.stderr + res.stdout)
    assert leftovers(tmp_path, "out") == []


def test_failed_verify_of_a_delta_overwrite_restores_the_previous_version(tmp_path, volumes, monkeypatch):
    from tests.conftest import run_cli
    from trainfeed.converters import verify as verify_mod
    from trainfeed.converters.cli import app
    from trainfeed.converters.formats import delta

    src, _truth = volumes
    dst = tmp_path / "t.delta"
    assert run_cli(app, src, dst, "--to", "delta", "--no-progress").exit_code == 0
    before = {sid: f["volume"].tobytes() for sid, _, f in delta.read_samples(dst)}
    real = verify_mod.same_value
    monkeypatch.setattr(verify_mod, "same_value", lambda a, b: False if isinstance(a, np.ndarray) else real(a, b))
    res = run_cli(app, src, dst, "--to", "delta", "--overwrite", "--verify", "--no-progress")
    assert res.exit_code == 1 and "verification failed" in res.stderr
    table = delta.open_table(dst)
    assert table.version() == 2  # 0: first write, 1: the overwrite, 2: the restore of version 0
    assert {sid: f["volume"].tobytes() for sid, _, f in delta.read_samples(dst)} == before


# ------------------------------------------------------------- labels: SRC/labels.csv


def test_labels_csv_in_the_source_is_picked_up_and_said(tmp_path, convert_cli):
    """`storage-bench generate` writes SRC/labels.csv: `convert` without --labels takes it (as
    `storage-bench run` does) and the summary says where the labels came from."""
    src = tmp_path / "vols"
    truth = write_volumes(src, 6)
    res = convert_cli(src, tmp_path / "o.h5", "--to", "hdf5")
    assert res.exit_code == 0, res.stderr
    assert (f"  labels    csv from {src / 'labels.csv'} (found in SRC; --labels CSV takes another, "
            "--no-folder-labels none)") in res.stdout.splitlines()
    from trainfeed.converters.formats import hdf5

    assert {sid: label for sid, label, _ in hdf5.read_samples(tmp_path / "o.h5")} == \
        {sid: label for sid, (_, label) in truth.items()}


def test_no_folder_labels_ignores_the_source_labels_csv(tmp_path, convert_cli):
    src = tmp_path / "vols"
    write_volumes(src, 6)
    res = convert_cli(src, tmp_path / "o.h5", "--to", "hdf5", "--no-folder-labels")
    assert res.exit_code == 0, res.stderr
    assert ("  labels    none (no SRC/labels.csv, no class subfolders; `train` needs labels: add them with "
            "--labels CSV)") in res.stdout.splitlines()
    from trainfeed.converters.formats import hdf5

    assert not hdf5.read_schema(tmp_path / "o.h5").labeled


def test_a_source_labels_csv_missing_a_file_names_the_file(tmp_path, convert_cli):
    """A stale SRC/labels.csv is not silently half-used: the run stops naming the file without a label."""
    src = tmp_path / "vols"
    write_volumes(src, 4)
    np.save(src / "extra.npy", np.zeros((6, 5, 4, 3), np.float32))
    res = convert_cli(src, tmp_path / "o.h5", "--to", "hdf5")
    assert res.exit_code == 1 and "extra" in res.stderr and "labels.csv" in res.stderr, res.stderr
    assert leftovers(tmp_path, "o.h5") == []


def test_verify_after_resize_says_what_was_compared(tmp_path, convert_cli):
    """--verify compares the stored pixels with the same decode and resize of each source file, not
    with the file itself: the summary says so."""
    write_images(tmp_path / "imgs", 4, size=(24, 32))
    res = convert_cli(tmp_path / "imgs", tmp_path / "o.h5", "--to", "hdf5", "--resize", "16x16", "--verify")
    assert res.exit_code == 0, res.stderr
    assert ("  verified  4 samples identical to their source files after the same decode and resize"
            in res.stdout.splitlines())
