"""A cloud added through the public registry API only (``clouds.register_cloud``): a ``toy://``
storage whose buckets are folders under a local root, behind fsspec's DirFileSystem, with a
passphrase as its credential. A store is converted onto it with ``trainfeed.convert`` and read
back bit for bit with ``trainfeed.open_store``; a refused passphrase, which the toy storage
echoes in its error, is masked in what the command prints. Nothing else is touched."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pytest
from fsspec import AbstractFileSystem
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem

import trainfeed
from tests.conftest import write_volumes
from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.storage.clouds import Cloud, cloud_for, register_cloud, unregister_cloud

PASSPHRASE = "open-sesame-0042"


class ToyOptions(TypedDict, total=False):
    passphrase: str  # not secret-looking by name: the cloud declares it secret


class ToyFileSystem(DirFileSystem):
    protocol = "toy"
    async_impl = False  # over a synchronous file system


@dataclass(frozen=True, eq=False)
class ToyCloud(Cloud):
    root: str = ""  # the local folder holding the buckets

    def open(self, url: str, options: dict[str, Any], deadline: float | None) -> AbstractFileSystem:
        given = options.get("passphrase")
        if given != PASSPHRASE:
            raise TrainfeedError(f"{url}: the toy storage refused passphrase {given}")
        return ToyFileSystem(path=self.root, fs=LocalFileSystem(auto_mkdir=True))  # no folders, as on a cloud


@pytest.fixture
def toy(tmp_path):
    root = tmp_path / "toy-root"
    (root / "bucket").mkdir(parents=True)
    cloud = register_cloud(ToyCloud(name="toy", schemes=("toy",), options_type=ToyOptions,
                                    secret_options=frozenset({"passphrase"}), root=str(root)))
    yield root
    unregister_cloud(cloud)
    assert cloud_for("toy") is None


def test_a_store_converted_onto_a_registered_cloud_reads_back_bit_for_bit(toy, tmp_path):
    volumes = write_volumes(tmp_path / "vols", 12)
    options: ToyOptions = {"passphrase": PASSPHRASE}
    trainfeed.convert(str(tmp_path / "vols"), "toy://bucket/store.parquet", format="parquet",
                      labels=str(tmp_path / "vols" / "labels.csv"), storage_options=options)
    assert (toy / "bucket" / "store.parquet" / "_trainfeed.json").is_file()  # written through the toy storage

    store = trainfeed.open_store("toy://bucket/store.parquet", storage_options=options)
    read: dict[str, tuple[np.ndarray, int]] = {}
    for batch in store.batches(batch_size=5, shuffle=False, drop_last=False):
        for i, sid in enumerate(batch.ids):
            read[sid] = (np.asarray(batch.x[i]), int(batch.y[i]))
    assert sorted(read) == sorted(volumes)
    for sid, (array, label) in volumes.items():
        assert read[sid][0].dtype == array.dtype and read[sid][0].tobytes() == array.tobytes()
        assert read[sid][1] == label


def test_a_secret_option_the_cloud_declares_is_masked(toy, tmp_path, convert_cli):
    write_volumes(tmp_path / "vols", 4)
    wrong = "wrong-passphrase-9137"
    res = convert_cli(tmp_path / "vols", "toy://bucket/other.parquet", "--to", "parquet",
                      "--storage-option", f"passphrase={wrong}")
    assert res.exit_code == 1
    assert "the toy storage refused passphrase ***" in res.stderr and wrong not in res.stderr + res.stdout
    assert not Path(toy / "bucket" / "other.parquet").exists()
