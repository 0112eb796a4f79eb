"""Databricks locations in the spelling each side needs: file APIs on every node read DBFS at
/dbfs and volumes at /Volumes; Spark's readers and writers take dbfs:/ for DBFS."""
from __future__ import annotations

import pytest

from trainfeed.pipelines.paths import fuse_path, spark_path


@pytest.mark.parametrize("given,read_at", [
    ("dbfs:/Volumes/main/ml/raw/vols", "/Volumes/main/ml/raw/vols"),
    ("dbfs:///Volumes/main/ml/raw/vols/", "/Volumes/main/ml/raw/vols/"),
    ("dbfs:/mnt/data/vols", "/dbfs/mnt/data/vols"),
    ("dbfs:/mnt/data/vols/", "/dbfs/mnt/data/vols"),
    ("dbfs:/Volumesque/x", "/dbfs/Volumesque/x"),  # not a volume
    # already file paths, or cloud URLs (read through fsspec with their storage options)
    ("/Volumes/main/ml/raw/vols", "/Volumes/main/ml/raw/vols"),
    ("/dbfs/mnt/data/vols", "/dbfs/mnt/data/vols"),
    ("abfss://raw@acct.dfs.core.windows.net/vols", "abfss://raw@acct.dfs.core.windows.net/vols"),
    ("data/vols", "data/vols"),
])
def test_dbfs_urls_are_read_through_the_fuse_mount(given, read_at):
    assert fuse_path(given) == read_at


@pytest.mark.parametrize("path,for_spark", [
    ("/dbfs/mnt/out/part-00000-0-000.parquet", "dbfs:/mnt/out/part-00000-0-000.parquet"),
    ("/dbfs", "dbfs:/"),
    ("/dbfsx/a", "/dbfsx/a"),
    ("/Volumes/main/ml/out/stores/delta", "/Volumes/main/ml/out/stores/delta"),
    ("/tmp/out", "/tmp/out"),
])
def test_spark_reads_dbfs_by_its_scheme(path, for_spark):
    assert spark_path(path) == for_spark


def test_the_two_spellings_meet():
    for url in ("dbfs:/mnt/data/vols", "dbfs:/Volumes/c/s/v"):
        assert spark_path(fuse_path(url)) in (url, url.removeprefix("dbfs:"))
