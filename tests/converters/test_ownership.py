"""The destination side of convert: trainfeed replaces or appends to only what it wrote,
never touches its source, lets one run at a time write a destination, and fails with a clear
message (nothing half-written visible) when the destination cannot be written."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import CommitProperties, DeltaTable, write_deltalake

from tests.conftest import write_images, write_volumes
from tests.converters.test_bad_input import tree_digest
from trainfeed.converters.commit import DestinationLock
from trainfeed.converters.formats import delta, hdf5
from trainfeed.converters.formats.registry import FORMATS
from trainfeed.converters.layout import MANIFEST

STORES = [("parquet", "out.parquet"), ("delta", "out.delta"), ("hdf5", "out.h5"), ("hdf5", "out_shards")]


def run_convert(*args) -> subprocess.CompletedProcess:
    """The console script in its own process (a crash shows as a negative return code)."""
    return subprocess.run([sys.executable, "-m", "trainfeed.converters", *map(str, args), "--no-progress"],
                          capture_output=True, text=True, timeout=120)


# A real conversion in another process that stops after its first sample until told to go
# on: the window in which another process acts on the destination.
HELD_RUN = """
import sys
from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.options import WriteOptions

def hold(files_done, _bytes):
    if files_done == 1:
        print("holding", flush=True)
        sys.stdin.readline()

src, dst, fmt, mode = sys.argv[1:]
try:
    convert(ConvertConfig(src, dst, fmt, write=WriteOptions(mode=mode), workers=1), progress=hold)
except TrainfeedError as exc:
    print(f"error: {exc}", file=sys.stderr)
    sys.exit(exc.exit_code)
"""


class HeldRun:
    def __init__(self, src: Path, dst: Path, fmt: str, mode: str = "create"):
        self.proc = subprocess.Popen([sys.executable, "-c", HELD_RUN, str(src), str(dst), fmt, mode],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if line != "holding\n":
            self.proc.kill()
            pytest.fail(f"the held run did not start: {line!r} {self.proc.stderr.read()}")

    def finish(self) -> tuple[int, str]:
        _, err = self.proc.communicate("go\n", timeout=120)
        return self.proc.returncode, err


def foreign_delta(path: Path) -> None:
    write_deltalake(str(path), pa.table({"id": ["x", "y"], "value": [1.5, 2.5]}))


def foreign_delta_with_user_metadata(path: Path) -> None:
    """Commit userMetadata marks a table trainfeed's only as {"trainfeed": ...} (the Spark repack's)."""
    for mode, note in (("error", "nightly load"), ("append", json.dumps({"job": "etl", "trainfeed_like": 1}))):
        write_deltalake(str(path), pa.table({"id": ["x"], "value": [1.5]}), mode=mode,
                        commit_properties=CommitProperties(custom_metadata={"userMetadata": note}))


def foreign_h5(path: Path) -> None:
    with h5py.File(path, "w") as h5:
        h5["data"] = np.arange(10)
        h5.attrs["owner"] = "someone else"


def plain_folder(path: Path) -> None:
    path.mkdir()
    for name in ("a.txt", "b.csv", "notes.md"):
        (path / name).write_text(f"precious {name}")


def plain_file(path: Path) -> None:
    path.write_bytes(b"years of work")


def foreign_manifest(path: Path) -> None:
    """A folder with a manifest that looks like trainfeed's but was written by another tool."""
    path.mkdir()
    (path / MANIFEST).write_text(json.dumps({"format": "parquet", "writer": "othertool 2.0", "schema": {
        "layout_version": 1, "fields": [{"name": "volume", "dtype": "float32", "shape": [2]}], "labeled": False},
        "parts": []}))
    (path / "part-00000.parquet").write_bytes(b"not ours")


# ------------------------------------------------------------------ 1. ownership


@pytest.mark.parametrize("make,name,fmt,what", [
    (foreign_delta, "t.delta", "delta", "a Delta table not written by trainfeed"),
    (foreign_delta, "t.delta", "parquet", "a Delta table not written by trainfeed"),
    (foreign_delta_with_user_metadata, "t.delta", "delta", "a Delta table not written by trainfeed"),
    (foreign_h5, "x.h5", "hdf5", "an HDF5 file not written by trainfeed"),
    (plain_folder, "results", "parquet", "a folder with 3 entries that is not a trainfeed store"),
    (plain_file, "thesis.h5", "hdf5", "a file of 13 bytes that is not a trainfeed store"),
    (foreign_manifest, "other.parquet", "parquet", "not written by trainfeed (writer 'othertool 2.0')"),
])
def test_overwrite_refuses_what_trainfeed_did_not_write(tmp_path, volumes, convert_cli, make, name, fmt, what):
    src, _ = volumes
    dst = tmp_path / name
    make(dst)
    before = tree_digest(dst)
    res = convert_cli(src, dst, "--to", fmt, "--overwrite")
    assert res.exit_code == 1, res.stderr
    assert res.stderr.startswith(f"error: {dst}: ") and what in res.stderr and "refusing to replace it" in res.stderr
    assert tree_digest(dst) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["vols", name])


def test_create_names_what_is_there_without_offering_overwrite(tmp_path, volumes, convert_cli):
    src, _ = volumes
    dst = tmp_path / "t.delta"
    foreign_delta(dst)
    res = convert_cli(src, dst, "--to", "delta")
    assert res.exit_code == 1
    assert res.stderr == (f"error: {dst}: destination already exists (a Delta table not written by trainfeed); "
                          "leaving it untouched\n")


def test_append_refuses_a_delta_table_not_written_by_trainfeed(tmp_path, volumes, convert_cli):
    src, _ = volumes
    dst = tmp_path / "t.delta"
    foreign_delta(dst)
    before = tree_digest(dst)
    res = convert_cli(src, dst, "--to", "delta", "--mode", "append")
    assert res.exit_code == 1
    assert res.stderr == (f"error: {dst}: --mode append adds to a Delta table written by trainfeed; "
                          "found a Delta table not written by trainfeed\n")
    assert tree_digest(dst) == before and DeltaTable(str(dst)).version() == 0


@pytest.mark.parametrize("fmt,name", STORES)
def test_every_new_store_gets_its_own_store_id(tmp_path, convert_cli, fmt, name):
    a, b = tmp_path / "a", tmp_path / "b"
    write_volumes(a, 4, seed=1, labels_csv=False)
    write_volumes(b, 4, seed=2, labels_csv=False)
    first, second = tmp_path / name, tmp_path / f"2{name}"
    ids = []
    for dst, args in ((first, []), (second, []), (first, ["--overwrite"])):
        res = convert_cli(a, dst, "--to", fmt, "--json", *args)
        assert res.exit_code == 0, res.stderr
        ids.append(json.loads(res.stdout)["store_id"])
        assert FORMATS[fmt].read_schema(dst).store_id == ids[-1]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert ids[0] != ids[1]
    if fmt == "delta":  # a table keeps its identity across commits; its version tells them apart
        assert ids[2] == ids[0]
        for f in b.glob("*.npy"):
            f.rename(b / f"b_{f.name}")
        assert convert_cli(b, first, "--to", "delta", "--mode", "append").exit_code == 0
        assert [delta.read_schema(first, v).store_id for v in range(3)] == [ids[0]] * 3
    else:
        assert ids[2] not in ids[:2]


# ------------------------------------------------------------------ 2. SRC and DST apart


def parquet_store_holding_the_source(tmp_path: Path, convert_cli) -> tuple[Path, Path]:
    """ds is a trainfeed store (replaceable) and the source folder sits inside it."""
    ds = tmp_path / "ds"
    seed = tmp_path / "seed"
    write_volumes(seed, 3, labels_csv=False)
    assert convert_cli(seed, ds, "--to", "parquet").exit_code == 0
    write_volumes(ds / "raw", 5, labels_csv=False)
    return ds / "raw", ds


@pytest.mark.parametrize("case", ["same", "same-via-symlink", "dst-inside-src", "dst-inside-src-file-url",
                                  "src-inside-dst", "src-inside-dst-via-dotdot"])
@pytest.mark.parametrize("extra", [[], ["--overwrite"]])
def test_overlapping_source_and_destination_are_refused(tmp_path, convert_cli, case, extra):
    if case.startswith("src-inside-dst"):
        src, ds = parquet_store_holding_the_source(tmp_path, convert_cli)
        dst = ds if case == "src-inside-dst" else src / ".." / ".." / "ds"
        message = f"error: {ds}: holds the source folder {src}, which writing here would replace"
    else:
        src = tmp_path / "vols"
        write_volumes(src, 5, labels_csv=False)
        dst, message = src, f"error: {src}: is the source folder itself"
        if case == "same-via-symlink":
            dst = tmp_path / "alias"
            dst.symlink_to(src)
        elif case.startswith("dst-inside-src"):
            dst = src / "out.parquet"
            message = f"error: {dst}: is inside the source folder {src}"
            if case.endswith("file-url"):
                src = f"file://{src}"
    before = tree_digest(Path(str(src).removeprefix("file://")))
    res = convert_cli(src, dst, "--to", "parquet", *extra)
    assert res.exit_code == 2 and res.stderr.startswith(message), res.stderr
    assert tree_digest(Path(str(src).removeprefix("file://"))) == before


# ------------------------------------------------------------------ 3. one writer, re-checked at commit


def test_a_run_on_a_locked_destination_fails_fast(tmp_path, volumes, convert_cli):
    src, _ = volumes
    dst = tmp_path / "out.parquet"
    with DestinationLock(dst) as lock:
        res = convert_cli(src, dst, "--to", "parquet")
        assert res.exit_code == 1
        assert res.stderr == (f"error: {dst}: another trainfeed run is writing it (pid {os.getpid()}); "
                              "try again when it has finished\n")
        assert not dst.exists() and lock.path.read_text() == f"{os.getpid()}\n"


@pytest.mark.parametrize("fmt,name", STORES)
def test_concurrent_runs_on_one_destination_never_both_succeed(tmp_path, volumes, convert_cli, fmt, name):
    src, truth = volumes
    other = tmp_path / "other"
    write_volumes(other, 3, seed=5, labels_csv=False)
    dst = tmp_path / name
    held = HeldRun(src, dst, fmt)
    for args in ([], ["--overwrite"]):
        res = convert_cli(other, dst, "--to", fmt, *args)
        assert res.exit_code == 1 and f"another trainfeed run is writing it (pid {held.proc.pid})" in res.stderr
    code, err = held.finish()
    assert code == 0, err
    stored = {sid: f["volume"] for sid, _, f in FORMATS[fmt].read_samples(dst)}
    assert set(stored) == set(truth) and all(np.array_equal(stored[k], truth[k][0]) for k in truth)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["vols", "other", name])


@pytest.mark.parametrize("fmt,name", STORES)
def test_what_appears_at_the_destination_during_a_run_is_kept(tmp_path, volumes, fmt, name):
    src, _ = volumes
    dst = tmp_path / name
    held = HeldRun(src, dst, fmt)
    (plain_file if name.endswith(".h5") else plain_folder)(dst)
    before = tree_digest(dst)
    code, err = held.finish()
    assert code == 1 and err.startswith(f"error: {dst}: ") and "nothing was published" in err, err
    assert tree_digest(dst) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["vols", name])


@pytest.mark.parametrize("fmt,name", STORES)
def test_overwrite_rechecks_the_destination_at_commit(tmp_path, volumes, convert_cli, fmt, name):
    """The store the run set out to replace was swapped for someone's own data meanwhile."""
    src, _ = volumes
    dst = tmp_path / name
    assert convert_cli(src, dst, "--to", fmt).exit_code == 0
    held = HeldRun(src, dst, fmt, "overwrite")
    os.rename(dst, tmp_path / "moved-away")
    (plain_file if name.endswith(".h5") else plain_folder)(dst)
    before = tree_digest(dst)
    code, err = held.finish()
    assert code == 1 and err.startswith(f"error: {dst}: "), err
    assert re.search("not a trainfeed store is there now|is no longer a Delta table written by trainfeed", err)
    assert re.search("nothing (was published|committed)", err)
    assert tree_digest(dst) == before


# ------------------------------------------------------------------ 4. appends


def rename_ids(folder: Path, prefix: str) -> None:
    for f in folder.rglob("*.*"):
        f.rename(f.with_name(prefix + f.name))


def test_append_keeps_class_numbers_and_numbers_new_classes_after_them(tmp_path, convert_cli):
    first, second = tmp_path / "first", tmp_path / "second"
    write_images(first, 4)  # classes a, b
    write_images(second, 4, seed=1)
    (second / "a").rename(second / "c")  # classes b, c
    rename_ids(second, "n_")
    dst = tmp_path / "t.delta"
    assert convert_cli(first, dst, "--to", "delta").exit_code == 0
    res = convert_cli(second, dst, "--to", "delta", "--mode", "append", "--verify", "--json")
    assert res.exit_code == 0, res.stderr
    assert json.loads(res.stdout)["label_map"] == {"a": 0, "b": 1, "c": 2}
    assert delta.read_schema(dst).label_map == {"a": 0, "b": 1, "c": 2}
    assert delta.read_schema(dst, 0).label_map == {"a": 0, "b": 1}
    labels = {sid: label for sid, label, _ in delta.read_samples(dst)}
    assert labels == {sid: {"a": 0, "b": 1, "c": 2}[sid.split("/")[0]] for sid in labels} and len(labels) == 8


@pytest.mark.parametrize("table_args,append_args,message", [
    (["--labels", "{src}/labels.csv"], ["--no-folder-labels"],
     "cannot append samples with no labels to a table with integer labels"),
    (["--no-folder-labels"], ["--labels", "{src}/labels.csv"],
     "cannot append samples with integer labels to a table with no labels"),
    (["--labels", "{src}/classes.csv"], ["--labels", "{src}/labels.csv"],
     "cannot append samples with integer labels to a table with class-name labels"),
])
def test_append_refuses_labels_of_another_kind(tmp_path, convert_cli, table_args, append_args, message):
    src = tmp_path / "vols"
    write_volumes(src, 4)
    (src / "classes.csv").write_text("id,label\n"
                                     + "".join(f"v{i:03d},{'cat' if i % 2 else 'dog'}\n" for i in range(4)))
    more = tmp_path / "more"
    write_volumes(more, 4, seed=3)
    rename_ids(more, "m_")
    (more / "labels.csv").write_text("id,label\n" + "".join(f"m_v{i:03d},{i % 2}\n" for i in range(4)))
    dst = tmp_path / "t.delta"
    assert convert_cli(src, dst, "--to", "delta", *[a.format(src=src) for a in table_args]).exit_code == 0
    before = tree_digest(dst)
    res = convert_cli(more, dst, "--to", "delta", "--mode", "append", *[a.format(src=more) for a in append_args])
    assert res.exit_code == 1 and res.stderr == f"error: {dst}: {message}\n"
    assert tree_digest(dst) == before


def test_ids_another_writer_appended_meanwhile_are_not_duplicated(tmp_path, volumes, convert_cli):
    """Ids are checked against the table at the start and again just before the commit: a
    writer that added one of this run's ids in between makes the run fail, appending nothing."""
    src, _ = volumes
    dst = tmp_path / "t.delta"
    assert convert_cli(src, dst, "--to", "delta", "--no-folder-labels").exit_code == 0
    more = tmp_path / "more"
    write_volumes(more, 4, seed=3, labels_csv=False)
    rename_ids(more, "m_")
    held = HeldRun(more, dst, "delta", "append")
    row = DeltaTable(str(dst)).to_pyarrow_table().slice(0, 1)
    row = row.set_column(0, row.schema.field(0), pa.array(["m_v002"]))
    write_deltalake(str(dst), row, mode="append")  # another tool, through the Delta log
    code, err = held.finish()
    assert code == 1 and err == (f"error: {dst}: cannot append: 1 of these sample ids were added to the table "
                                 "by another writer while this run was writing (e.g. ['m_v002']); nothing appended\n")
    table = DeltaTable(str(dst))
    assert table.version() == 1
    ids = table.to_pyarrow_table(columns=["id"]).column("id")
    assert pc.sum(pc.equal(ids, "m_v002")).as_py() == 1 and len(ids) == 31
    assert sorted(p.name for p in dst.glob("*.parquet")) == sorted(Path(f).name for f in table.file_uris())


# ------------------------------------------------------------------ 5. clear errors


@pytest.mark.parametrize("content,problem", [
    ("", "not valid JSON (empty file)"),
    ("{\"format\": \"parquet\",", "not valid JSON"),
    ("[1, 2]", "holds a JSON list, not the manifest object"),
    ("SCHEMA:dtype=float99", "invalid dataset schema: field 'volume' has dtype 'float99'"),
    ("SCHEMA:shape=abc", "invalid dataset schema: field 'volume' has shape 'abc', not a list of sizes"),
    ("PARTS:../../etc/passwd", "part 0 is {'file': '../../etc/passwd', 'rows': 3}"),
])
@pytest.mark.parametrize("fmt,name", [("parquet", "out.parquet"), ("hdf5", "out_shards")])
def test_corrupt_manifest_is_a_clear_error(tmp_path, volumes, convert_cli, content, problem, fmt, name):
    src, _ = volumes
    dst = tmp_path / name
    assert convert_cli(src, dst, "--to", fmt).exit_code == 0
    manifest = dst / MANIFEST
    if content.startswith(("SCHEMA:", "PARTS:")):
        good = json.loads(manifest.read_text())
        key, _, value = content.partition(":")
        if key == "SCHEMA":
            field, _, bad = value.partition("=")
            good["schema"]["fields"][0][field] = bad
        else:
            good["parts"][0] = {"file": value, "rows": 3}
        content = json.dumps(good)
    manifest.write_text(content)
    before = tree_digest(dst)
    res = convert_cli(src, dst, "--to", fmt, "--overwrite")  # not recognisably ours: refused
    assert res.exit_code == 1 and res.stderr.startswith(f"error: {dst}: a folder with an invalid trainfeed manifest")
    assert f"{manifest}: {problem}" in res.stderr and "refusing to replace it" in res.stderr
    assert tree_digest(dst) == before
    reader = FORMATS[fmt]
    for read in (reader.read_schema, reader.data_files):
        with pytest.raises(ValueError) as err:
            read(dst)
        assert str(err.value).startswith(f"{manifest}: {problem}")


def test_hdf5_reader_names_a_file_without_trainfeed_attributes(tmp_path):
    foreign_h5(tmp_path / "x.h5")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'x.h5'}: no 'trainfeed' root attribute")):
        hdf5.read_schema(tmp_path / "x.h5")


@pytest.mark.parametrize("damage", [b"", b"{\"commitInfo\": garb", b"\x00\x01binary"])
@pytest.mark.parametrize("args", [["--overwrite"], ["--mode", "append"]])
def test_corrupt_delta_log_is_a_clear_error(tmp_path, volumes, convert_cli, damage, args):
    src, _ = volumes
    dst = tmp_path / "t.delta"
    assert convert_cli(src, dst, "--to", "delta").exit_code == 0
    (dst / "_delta_log" / "00000000000000000000.json").write_bytes(damage)
    before = tree_digest(dst)
    res = convert_cli(src, dst, "--to", "delta", *args)
    assert res.exit_code == 1
    assert re.fullmatch(rf"error: {re.escape(str(dst))}: .*a Delta table whose log cannot be read "
                        rf"\({re.escape(str(dst))}/_delta_log: cannot read the Delta log: .+\)[^\n]*\n", res.stderr)
    assert tree_digest(dst) == before


def test_destination_under_a_file_is_a_clear_error(tmp_path, volumes, convert_cli):
    src, _ = volumes
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    dst = tmp_path / "notes.txt" / "sub" / "out.parquet"
    res = convert_cli(src, dst, "--to", "parquet")
    assert res.exit_code == 1
    assert res.stderr == f"error: {dst}: cannot be created: {tmp_path / 'notes.txt'} is a file, not a folder\n"
    assert (tmp_path / "notes.txt").read_text() == "a file, not a folder"


@pytest.fixture
def tmpfs(tmp_path):
    """Mount a small tmpfs: a real full or read-only filesystem. chmod cannot make a folder
    read-only for root (and the tests run as root), so this needs mount rights; without them
    the tests skip."""
    mounted = []

    def mount(name: str, options: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        try:
            res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                                 capture_output=True, text=True)
        except FileNotFoundError:
            pytest.skip("no mount command to create a small filesystem")
        if res.returncode:
            pytest.skip(f"cannot mount a tmpfs (needs root): {res.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.parametrize("fmt,name", STORES)
def test_read_only_destination_is_a_clear_error(tmp_path, volumes, convert_cli, tmpfs, fmt, name):
    src, _ = volumes
    dst = tmpfs("ro", "ro,size=64k") / name
    res = convert_cli(src, dst, "--to", fmt)
    assert res.exit_code == 1 and res.stderr == f"error: {dst}: cannot write: read-only file system\n"


@pytest.mark.parametrize("fmt,name", STORES)
def test_full_disk_is_a_clear_error_and_leaves_nothing(tmp_path, tmpfs, fmt, name):
    """Runs the CLI in its own process: HDF5 used to crash the interpreter (SIGSEGV) here."""
    src = tmp_path / "vols"
    write_volumes(src, 24, shape=(16, 16, 16), labels_csv=False)  # 16 KB each, 384 KB in all
    disk = tmpfs("disk", "size=128k")
    dst = disk / name
    res = run_convert(src, dst, "--to", fmt, "--target-file-size", "40KB", "--row-group-size", "16KB")
    assert res.returncode == 1 and res.stderr == f"error: {dst}: cannot write: no space left on device\n"
    assert list(disk.iterdir()) == []


# ------------------------------------------------------------------ 6. usage errors


@pytest.mark.parametrize("fmt,args,message", [
    ("parquet", ["--compression", "zstd", "--compression-level", "23"],
     "--compression-level 23: zstd levels for parquet are 1 to 22"),
    ("delta", ["--compression", "zstd", "--compression-level", "0"],
     "--compression-level 0: zstd levels for delta are 1 to 22"),
    ("parquet", ["--compression", "gzip", "--compression-level", "10"], "gzip levels for parquet are 1 to 9"),
    ("parquet", ["--compression", "brotli", "--compression-level", "12"], "brotli levels for parquet are 0 to 11"),
    ("hdf5", ["--compression", "gzip", "--compression-level", "10"], "gzip levels for hdf5 are 0 to 9"),
    ("parquet", ["--compression-level", "3"], "--compression none takes no level"),
    ("delta", ["--compression", "snappy", "--compression-level", "3"], "--compression snappy takes no level"),
    ("parquet", ["--compression", "lz4", "--compression-level", "3"], "--compression lz4 takes no level"),
    ("hdf5", ["--compression", "lzf", "--compression-level", "3"],
     "--compression lzf takes no level (levels for hdf5: gzip 0-9)"),
    ("delta", ["--vacuum-hours", "-1"], "--vacuum-hours must be 0 or more, not -1"),
])
def test_usage_errors_exit_2_without_traceback(tmp_path, volumes, convert_cli, fmt, args, message):
    src, _ = volumes
    res = convert_cli(src, tmp_path / "out", "--to", fmt, *args)
    assert res.exit_code == 2 and res.stderr.startswith("error: ") and message in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vols"]


def test_hdf5_gzip_level_0_is_honoured(tmp_path, volumes, convert_cli):
    src, _ = volumes
    dst = tmp_path / "o.h5"
    assert convert_cli(src, dst, "--to", "hdf5", "--compression", "gzip", "--compression-level", "0").exit_code == 0
    with h5py.File(dst, "r") as h5:
        assert h5["volume"].compression == "gzip" and h5["volume"].compression_opts == 0
