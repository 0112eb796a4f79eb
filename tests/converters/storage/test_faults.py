"""Storage faults, injected by a loopback relay in front of real servers (Azurite, moto's S3):
a storage throttling for a while is waited out, a connection reset in the middle of a range
costs that range only, and a storage that keeps failing, credentials that stop working or an
object deleted under the reader end the run with a message naming the URL and exit 1, never
a traceback, never wrong samples."""
from __future__ import annotations

from collections import Counter

import pytest

import trainfeed
from tests.conftest import run_cli
from tests.test_object_storage import SMALL, convert, get_backend, labels, on, source

from .relay import Relay
from .test_stale import assert_same

BACKENDS = [on("azurite"), on("s3")]


@pytest.fixture(params=BACKENDS)
def relayed(request, tmp_path):
    """A Parquet store (48 samples: 4 parts of 3 row groups) on the server, its truth, and a
    relay in front of the server with the storage options (Python and CLI) that go through it."""
    backend = get_backend(request, request.param)
    src = tmp_path / "vols"
    truth = source(src, seed=4)
    url = backend.url(backend.new_bucket("faults"), "store.parquet")
    assert convert(src, url, "parquet", backend, *labels(src), *SMALL).exit_code == 0
    server = request.getfixturevalue("azurite_server" if request.param == "azurite" else "s3_server")
    with Relay(server.endpoint) as relay:
        if request.param == "azurite":
            options = {"connection_string": server.connection_string.replace(server.endpoint, relay.endpoint)}
        else:
            options = {**backend.options, "endpoint_url": relay.endpoint}
        cli = [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]
        yield url, truth, relay, {**options, "call_timeout": "3"}, [*cli, "--storage-option", "call_timeout=3"]


def read(url: str, options: dict, **kwargs) -> dict:
    store = trainfeed.open_store(url, storage_options=options, **kwargs)
    return {i: (x.copy(), int(y)) for b in store.batches(batch_size=8, shuffle=False) for i, x, y in
            zip(b.ids, b.x, b.y)}


def test_a_storage_throttling_for_a_while_is_waited_out(relayed):
    url, truth, relay, options, _ = relayed
    relay.fail(3, 503)
    relay.fail(2, 500)
    assert_same(read(url, options), truth)
    assert relay.count("status 503") == 3 and relay.count("status 500") == 2


def test_a_connection_reset_mid_range_refetches_that_range_only(relayed):
    url, truth, relay, options, _ = relayed
    store = trainfeed.open_store(url, storage_options=options)
    opened = len(relay.requests)
    relay.cut(1, after=100)
    got = {i: (x.copy(), int(y)) for b in store.batches(batch_size=8, shuffle=False) for i, x, y in
           zip(b.ids, b.x, b.y)}
    assert_same(got, truth)
    (cut,) = [(path, rng) for _, path, rng, what in relay.requests if what.startswith("cut")]
    start, end = (int(x) for x in cut[1].removeprefix("bytes=").split("-"))
    again = [(path, rng) for _, path, rng, what in relay.requests[opened:]
             if path == cut[0] and rng != cut[1] and rng.endswith(f"-{end}")]
    reads = Counter((path, rng) for _, path, rng, _ in relay.requests[opened:])
    # the reset range is asked again, whole or from where it broke (bytes 100 on)...
    resumed = [int(rng.removeprefix("bytes=").split("-")[0]) for _, rng in again]
    assert reads[cut] + len(again) == 2 and all(start < s <= start + 100 for s in resumed), relay.requests
    # ...and every other range once
    assert all(n == 1 for key, n in reads.items() if key != cut and key not in again)


def test_a_storage_that_keeps_failing_ends_the_run_naming_the_url(relayed, tmp_path):
    from trainfeed.training.cli import app

    url, _, relay, _, cli = relayed
    relay.fail(10_000, 500)
    res = run_cli(app, "--data", url, *cli, "--epochs", "1", "--steps-per-epoch", "2", "--width", "4",
                  "--batch-size", "8", "--out", tmp_path / "run", "--no-progress")
    assert res.exit_code == 1
    assert res.stderr.startswith(f"error: {url}") and "answered HTTP 500" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.splitlines()) == 1


def test_credentials_that_stop_working_mid_epoch_end_the_run(relayed):
    url, _, relay, options, _ = relayed
    store = trainfeed.open_store(url, storage_options=options)
    relay.deny()
    with pytest.raises(trainfeed.TrainfeedError, match="access denied: the credentials were refused or have expired"):
        list(store.batches(batch_size=8, shuffle=False))


def test_an_object_deleted_while_reading_ends_the_run(relayed):
    url, _, _, options, _ = relayed
    store = trainfeed.open_store(url, storage_options=options)
    listing = store.reader.listing
    fetcher = listing.remote.fetcher
    fetcher.fs.rm_file(listing.files[0])
    with pytest.raises(trainfeed.TrainfeedError, match="the store changed while it was being read "
                                                       r"\(an object was deleted\); reopen it"):
        list(store.batches(batch_size=8, shuffle=False))
