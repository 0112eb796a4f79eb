"""The registry of clouds: every scheme names one cloud, which says its noun, its options'
type, its credentials and the emulators the tests run it against."""
from __future__ import annotations

import importlib

import pytest

from trainfeed.converters.storage.azure import AzureOptions
from trainfeed.converters.storage.clouds import Cloud, ObjectStoreCloud, cloud_for, clouds, register_cloud
from trainfeed.converters.storage.config import bucket_not_found
from trainfeed.converters.storage.gcs import GCSOptions
from trainfeed.converters.storage.s3 import S3Options


@pytest.mark.parametrize("scheme, name, noun, options", [
    ("abfs", "azure", "container", AzureOptions), ("ABFSS", "azure", "container", AzureOptions),
    ("az", "azure", "container", AzureOptions), ("s3", "s3", "bucket", S3Options), ("s3a", "s3", "bucket", S3Options),
    ("gs", "gcs", "bucket", GCSOptions), ("gcs", "gcs", "bucket", GCSOptions),
])
def test_each_scheme_names_its_cloud(scheme, name, noun, options):
    cloud = cloud_for(scheme)
    assert isinstance(cloud, ObjectStoreCloud)
    assert (cloud.name, cloud.noun, cloud.options_type) == (name, noun, options)
    assert bucket_not_found(f"{scheme}://b/x").endswith(f"{noun} 'b' not found; check its name and the account or "
                                                        f"endpoint (trainfeed does not create {noun}s)")


@pytest.mark.parametrize("scheme", ["file", "memory", "http", "emulated", ""])
def test_other_schemes_are_plain_fsspec(scheme):
    assert cloud_for(scheme) is None


def test_every_emulator_a_cloud_names_can_be_started():
    named = {name for cloud in clouds() for name in cloud.emulators}
    assert named == {"azurite", "s3server", "s3rver"}
    for name in named:
        assert callable(importlib.import_module(f"trainfeed.benchmarks.emulators.{name}").start)


def test_a_scheme_belongs_to_one_cloud():
    with pytest.raises(ValueError, match="scheme\\(s\\) s3 already belong to 's3'"):
        register_cloud(Cloud(name="other", schemes=("s3",), options_type=dict))
    assert cloud_for("s3").name == "s3"


def test_a_sas_token_in_an_azure_url_is_an_option_elsewhere_refused():
    sas = "sv=2024-01-01&sig=abc"
    assert cloud_for("abfs").url_options(sas) == {"sas_token": sas}
    assert cloud_for("s3").url_options(sas) is None
