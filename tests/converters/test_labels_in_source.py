"""`convert` takes SRC/labels.csv when --labels is not given (as `storage-bench run` does), also
when SRC is on object storage, and says where the labels came from (issue #25)."""
from __future__ import annotations

import uuid

import pytest

from tests.conftest import write_volumes


@pytest.mark.azurite
def test_labels_csv_in_a_remote_source_is_picked_up(azurite_server, tmp_path, convert_cli):
    import fsspec

    from trainfeed.converters.formats import hdf5

    truth = write_volumes(tmp_path / "vols", 6)
    container = f"labels-{uuid.uuid4().hex[:12]}"
    azurite_server.create_container(container)
    fs = fsspec.filesystem("abfs", skip_instance_cache=True, **azurite_server.storage_options)
    fs.put(str(tmp_path / "vols"), f"{container}/vols", recursive=True)
    src = f"abfs://{container}/vols"
    res = convert_cli(src, tmp_path / "o.h5", "--to", "hdf5",
                      "--storage-option", f"connection_string={azurite_server.connection_string}")
    assert res.exit_code == 0, res.stderr
    assert (f"  labels    csv from {src}/labels.csv (found in SRC; --labels CSV takes another, --no-folder-labels "
            "none)") in res.stdout.splitlines()
    assert {sid: label for sid, label, _ in hdf5.read_samples(tmp_path / "o.h5")} == \
        {sid: label for sid, (_, label) in truth.items()}
