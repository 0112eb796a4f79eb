"""The staging/commit step on its own, including the two-rename fallbacks, and the lock."""
from __future__ import annotations

import errno
import os

import h5py
import pytest

from trainfeed.converters import commit
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.manifest import WRITER, write_manifest
from trainfeed.converters.layout import DATASET_META, DatasetSchema, FieldSpec

SCHEMA = DatasetSchema(fields=[FieldSpec("volume", "float32", (2,))], labeled=False)


def make_store(path, content: str) -> None:
    """A folder trainfeed would recognise as its own Parquet store (its manifest), plus a file."""
    path.mkdir()
    write_manifest(path, "parquet", SCHEMA, [])
    (path / "data").write_text(content)


def make_h5(path, content: str) -> None:
    """A single-file HDF5 store carrying trainfeed's root attributes."""
    with h5py.File(path, "w") as h5:
        h5.attrs[DATASET_META] = SCHEMA.to_json()
        h5.attrs["writer"] = WRITER
        h5.attrs["content"] = content


def h5_content(path) -> str:
    with h5py.File(path, "r") as h5:
        return h5.attrs["content"]


@pytest.fixture(params=["renameat2", "fallback"])
def noreplace(request, monkeypatch):
    """Run a test with the kernel's RENAME_NOREPLACE, and again with the portable fallback
    (mkdir + rename for folders, link + unlink for files) used where it is missing."""
    if request.param == "fallback":
        monkeypatch.setattr(commit, "_renameat2", lambda a, b, flags: errno.ENOSYS)
    return request.param


def test_commit_swaps_atomically_and_cleans_up(tmp_path):
    dst = tmp_path / "store"
    make_store(dst, "old")
    with commit.Staging(dst, overwrite=True) as st:
        make_store(st.path, "new")
        st.commit()
    assert (dst / "data").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_abandoned_staging_is_removed(tmp_path):
    dst = tmp_path / "store"
    with pytest.raises(RuntimeError), commit.Staging(dst) as st:
        st.path.mkdir()
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_fallback_without_rename_exchange(tmp_path, monkeypatch):
    monkeypatch.setattr(commit, "exchange", lambda a, b: False)
    dst = tmp_path / "store.h5"
    make_h5(dst, "old")
    with commit.Staging(dst, overwrite=True) as st:
        make_h5(st.path, "new")
        st.commit()
    assert h5_content(dst) == "new" and [p.name for p in tmp_path.iterdir()] == ["store.h5"]


def test_killed_between_fallback_renames_restores_the_old_store(tmp_path):
    """Where RENAME_EXCHANGE is missing, a kill after the old store was moved aside and before
    the new one moved in leaves only the aside copy: the next run puts it back."""
    dst = tmp_path / "store"
    aside = tmp_path / ".store.trainfeed-old-999999"
    aside.mkdir()
    (aside / "data").write_text("old")
    stale = tmp_path / ".store.trainfeed-tmp-999999-abcd"
    stale.mkdir()
    commit.clean_stale(dst)
    assert (dst / "data").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_create_commit_never_replaces_a_folder_that_appeared(tmp_path, noreplace):
    """A create-mode run found nothing at DST; a folder created there while it was writing
    survives the commit, which fails and publishes nothing."""
    dst = tmp_path / "store"
    with pytest.raises(TrainfeedError) as err, commit.Staging(dst) as st:
        make_store(st.path, "new")
        dst.mkdir()
        (dst / "mine.txt").write_text("someone else's")
        st.commit()
    assert "a folder with 1 entry that is not a trainfeed store is there now" in str(err.value)
    assert "nothing was published" in str(err.value)
    assert [p.name for p in dst.iterdir()] == ["mine.txt"] and (dst / "mine.txt").read_text() == "someone else's"
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_create_commit_never_replaces_a_file_that_appeared(tmp_path, noreplace):
    """The same for a single-file store: even another trainfeed store that appeared is kept."""
    dst = tmp_path / "store.h5"
    with pytest.raises(TrainfeedError, match="an HDF5 store written by trainfeed is there now"), \
            commit.Staging(dst) as st:
        make_h5(st.path, "new")
        make_h5(dst, "theirs")
        st.commit()
    assert h5_content(dst) == "theirs" and [p.name for p in tmp_path.iterdir()] == ["store.h5"]


def test_fallback_without_renameat2_publishes_folders_and_files(tmp_path, monkeypatch):
    monkeypatch.setattr(commit, "_renameat2", lambda a, b, flags: errno.ENOSYS)
    folder, single = tmp_path / "store", tmp_path / "store.h5"
    with commit.Staging(folder) as st:
        make_store(st.path, "new")
        st.commit()
    with commit.Staging(single) as st:
        make_h5(st.path, "new")
        st.commit()
    assert (folder / "data").read_text() == "new" and h5_content(single) == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store", "store.h5"]


@pytest.mark.parametrize("swap", ["exchange", "fallback"])
def test_overwrite_commit_refuses_what_replaced_the_store_meanwhile(tmp_path, monkeypatch, swap):
    """An overwrite checked DST at the start; if someone put a folder of their own there
    before the commit, the commit leaves it untouched."""
    if swap == "fallback":
        monkeypatch.setattr(commit, "exchange", lambda a, b: False)
    dst = tmp_path / "store"
    make_store(dst, "old")
    with pytest.raises(TrainfeedError, match="a folder with 2 entries that is not a trainfeed store is there now"), \
            commit.Staging(dst, overwrite=True) as st:
        make_store(st.path, "new")
        (dst / "_trainfeed.json").unlink()
        (dst / "notes.txt").write_text("mine")
        st.commit()
    assert sorted(p.name for p in dst.iterdir()) == ["data", "notes.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_overwrite_commit_replaces_an_empty_folder(tmp_path):
    dst = tmp_path / "store"
    dst.mkdir()
    with commit.Staging(dst, overwrite=True) as st:
        make_store(st.path, "new")
        st.commit()
    assert (dst / "data").read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["store"]


def test_lock_is_exclusive_names_its_holder_and_leaves_nothing(tmp_path):
    dst = tmp_path / "store"
    with commit.DestinationLock(dst) as held:
        assert held.path.read_text() == f"{os.getpid()}\n"
        with pytest.raises(TrainfeedError) as err, commit.DestinationLock(dst):
            pass
        assert str(err.value) == (f"{dst}: another trainfeed run is writing it (pid {os.getpid()}); "
                                  "try again when it has finished")
    assert list(tmp_path.iterdir()) == []
    with commit.DestinationLock(dst):  # free again
        pass


def test_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    """flock dies with its process: a lock file left behind by a SIGKILL does not block."""
    dst = tmp_path / "store"
    (tmp_path / ".store.trainfeed-lock").write_text("999999\n")
    with commit.DestinationLock(dst) as held:
        assert held.path.read_text() == f"{os.getpid()}\n"
    assert list(tmp_path.iterdir()) == []
