"""Sample ids from the paths Spark qualifies (file:, dbfs:/Volumes, dbfs:/ vs /dbfs/, abfss://)
equal the ids `convert` gives the same files: what the labels CSV is keyed by."""
from __future__ import annotations

import os

import pytest

from trainfeed.pipelines.paths import canonical, sample_id, source_root


@pytest.mark.parametrize("src,spark_path,expected", [
    # local folders: Spark says file:/..., the user may say a relative path or file://
    ("/data/vols", "file:/data/vols/pos/v001.npy", "pos/v001"),
    ("file:///data/vols/", "file:/data/vols/v001.npy", "v001"),
    # a Unity Catalog volume, named as users do; Spark qualifies it as dbfs:/Volumes/...
    ("/Volumes/main/ml/raw/vols", "dbfs:/Volumes/main/ml/raw/vols/v001.npy", "v001"),
    ("dbfs:/Volumes/main/ml/raw/vols", "dbfs:/Volumes/main/ml/raw/vols/a/v001.npy", "a/v001"),
    # DBFS through its FUSE mount (/dbfs/...) or its scheme (dbfs:/...)
    ("/dbfs/mnt/data/vols", "dbfs:/mnt/data/vols/v001.npy", "v001"),
    ("dbfs:/mnt/data/vols", "dbfs:/mnt/data/vols/v001.npy", "v001"),
    # ADLS Gen2: Spark keeps the scheme and the container@account authority
    ("abfss://raw@acct.dfs.core.windows.net/vols",
     "abfss://raw@acct.dfs.core.windows.net/vols/pos/v001.npy", "pos/v001"),
])
def test_ids_from_qualified_paths(src, spark_path, expected):
    assert sample_id(spark_path, source_root(src)) == expected


def test_a_relative_source_is_made_absolute_on_the_driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert source_root("data/vols") == os.path.join(str(tmp_path), "data", "vols")
    assert sample_id(f"file:{tmp_path}/data/vols/x/v7.npy", source_root("data/vols")) == "x/v7"


@pytest.mark.parametrize("a,b", [
    ("dbfs:/Volumes/c/s/v", "/Volumes/c/s/v"), ("/dbfs/mnt/x", "dbfs:/mnt/x"), ("file:/a/b/", "/a/b"),
    ("file:///a//b", "/a/b"),
])
def test_one_spelling_per_location(a, b):
    assert canonical(a) == canonical(b)


def test_other_locations_stay_apart():
    assert canonical("/Volumes/c/s/v") != canonical("/dbfs/c/s/v")
    assert canonical("abfss://raw@acct.dfs.core.windows.net/v") != canonical("abfss://raw@other.dfs.core.windows.net/v")
