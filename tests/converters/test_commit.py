"""The staging/commit step on its own, including the two-rename fallback."""
from __future__ import annotations

import pytest

from converters import commit


def test_commit_swaps_atomically_and_cleans_up(tmp_path):
    dst = tmp_path / "store"
    dst.mkdir()
    (dst / "old").write_text("old")
    with commit.Staging(dst) as st:
        st.path.mkdir()
        (st.path / "new").write_text("new")
        st.commit()
    assert [p.name for p in dst.iterdir()] == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["store"]


def test_abandoned_staging_is_removed(tmp_path):
    dst = tmp_path / "store"
    with pytest.raises(RuntimeError):
        with commit.Staging(dst) as st:
            st.path.mkdir()
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_fallback_without_rename_exchange(tmp_path, monkeypatch):
    monkeypatch.setattr(commit, "exchange", lambda a, b: False)
    dst = tmp_path / "store.h5"
    dst.write_text("old")
    with commit.Staging(dst) as st:
        st.path.write_text("new")
        st.commit()
    assert dst.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["store.h5"]


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
