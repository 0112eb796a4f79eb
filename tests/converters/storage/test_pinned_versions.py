"""Issue #24, item 2: a reader never mixes generations, whatever the server does with
conditional headers. s3rver ignores ``If-Match``: it serves the new object to a request pinned
to the old ETag. The reader compares the ETag every answer names with the one pinned when the
store was opened, so an overwrite under a running reader is the same "store changed" error as
on servers that answer 412."""
from __future__ import annotations

import pytest

import trainfeed
from tests.conftest import write_volumes

SHAPE = (4, 4, 2)


@pytest.fixture(scope="module")
def s3rver_server(tmp_path_factory):
    from trainfeed.benchmarks.emulators import s3rver

    try:
        server = s3rver.start("pinned", workdir=tmp_path_factory.mktemp("s3rver"))
    except s3rver.S3rverError as exc:
        pytest.skip(str(exc))
    with server:
        yield server


def test_s3rver_ignores_if_match_so_the_reader_checks_the_etag_itself(s3rver_server, tmp_path):
    options = s3rver_server.storage_options
    url = "s3://pinned/store.h5"  # one object, replaced under the same key
    old = write_volumes(tmp_path / "old", 48, shape=SHAPE, seed=1)
    new = write_volumes(tmp_path / "new", 48, shape=SHAPE, seed=2)
    common = dict(format="hdf5", storage_options=options, hdf5_chunk_size=8 * 128)
    trainfeed.convert(str(tmp_path / "old"), url, labels=str(tmp_path / "old" / "labels.csv"), **common)
    store = trainfeed.open_store(url, storage_options=options)
    # what the server does with a stale If-Match: it answers 200 with the current object
    from trainfeed.converters.storage.native import Identity

    listing = store.reader.listing
    fetcher = listing.opener.fetcher
    path = listing.files[0]
    stale = Identity(fetcher.identities[path].size, etag="0" * 32)
    with pytest.raises(trainfeed.TrainfeedError, match="store changed while it was being read"):
        fetcher.fs.get_range(path, 0, 4, stale)
    trainfeed.convert(str(tmp_path / "new"), url, labels=str(tmp_path / "new" / "labels.csv"), mode="overwrite",
                      **common)
    with pytest.raises(trainfeed.TrainfeedError, match="store changed while it was being read"):
        list(store.batches(8))
    reopened = trainfeed.open_store(url, storage_options=options)
    got = {i: x.tobytes() for b in reopened.batches(8) for i, x in zip(b.ids, b.x)}
    assert got == {i: a.tobytes() for i, (a, _) in new.items()}
    assert got != {i: a.tobytes() for i, (a, _) in old.items()}
