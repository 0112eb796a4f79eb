"""Storage options in fsspec's names reach the native client (and delta-rs) in object_store's,
with trainfeed's call timeout as the client's retry limit."""
from __future__ import annotations

from datetime import timedelta

import pytest

from trainfeed.converters.errors import UsageError
from trainfeed.converters.storage.clouds import ObjectStoreCloud, cloud_for
from trainfeed.converters.storage.config import call_timeout, object_store_options
from trainfeed.converters.storage.native import NativeFileSystem

CONN = ("DefaultEndpointsProtocol=http;AccountName=acct;AccountKey=a2V5;"
        "BlobEndpoint=http://127.0.0.1:10000/acct;")


def client_settings(scheme, options, deadline):
    """The native client's settings for ``scheme``'s cloud."""
    cloud = cloud_for(scheme)
    assert isinstance(cloud, ObjectStoreCloud)
    return cloud.client_settings(options, deadline)


def test_an_azure_connection_string_becomes_account_key_and_endpoint():
    config, client, retry = client_settings("abfs", {"connection_string": CONN, "call_timeout": "7"}, 7.0)
    assert config == {"account_name": "acct", "account_key": "a2V5", "endpoint": "http://127.0.0.1:10000/acct"}
    assert client["allow_http"] is True and client["timeout"] == timedelta(seconds=7)
    assert retry["retry_timeout"] == timedelta(seconds=7)


def test_s3fs_names_become_aws_names():
    options = {"key": "K", "secret": "S", "client_kwargs": {"endpoint_url": "https://s3.example", "region_name": "r"}}
    assert object_store_options("s3", options) == {
        "aws_access_key_id": "K", "aws_secret_access_key": "S", "aws_endpoint_url": "https://s3.example",
        "aws_region": "r", "conditional_put": "etag"}
    config, client, _ = client_settings("s3", options, None)
    assert "allow_http" not in client and client["timeout"] == timedelta(days=1)  # 0: no limit
    assert config["conditional_put"] == "etag"


def test_object_store_names_pass_through_and_the_environment_fills_in(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", CONN)
    assert object_store_options("az", {})["account_name"] == "acct"
    assert object_store_options("az", {"azure_storage_account_name": "other"}) == {
        "azure_storage_account_name": "other"}


@pytest.mark.parametrize("value, seconds", [("0", None), ("2.5", 2.5), (None, 30.0)])
def test_the_call_timeout(value, seconds):
    assert call_timeout({} if value is None else {"call_timeout": value}) == seconds


@pytest.mark.parametrize("value", ["-1", "soon", "nan"])
def test_a_bad_call_timeout_is_a_usage_error(value):
    with pytest.raises(UsageError, match="call_timeout expects a number of seconds"):
        call_timeout({"call_timeout": value})


@pytest.mark.parametrize("url, path", [
    ("abfs://container/a/b.npy", "container/a/b.npy"),
    ("abfss://container@account.dfs.core.windows.net/a/b", "container/a/b"),
    ("s3://bucket/", "bucket"),
    ("abfs://user:secret@container/x", "container/x"),  # credentials in the URL are not a container
])
def test_paths_are_bucket_slash_key(url, path):
    assert NativeFileSystem._strip_protocol(url) == path


def test_the_account_in_an_abfss_url_is_the_account_used():
    from trainfeed.converters.storage.filesystems import open_fs

    fs, path = open_fs("abfss://data@myacct.dfs.core.windows.net/vols", {"account_key": "a2V5"})
    assert isinstance(fs, NativeFileSystem) and path == "data/vols"
    assert fs._settings[0] == {"account_name": "myacct", "account_key": "a2V5"}
