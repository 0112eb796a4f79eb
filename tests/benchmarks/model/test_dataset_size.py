"""A store's size projected to the full dataset (`measured.data_bytes_per_sample`, the [ram] note):
the bytes one sample adds to it, never the bytes a pass over a small store moved per sample,
which hold its fixed overhead."""
from __future__ import annotations

import pytest

from tests.benchmarks.model.test_cost import inst
from tests.benchmarks.recorded import cell
from trainfeed.benchmarks.model.cost import Workload, project_catalog
from trainfeed.benchmarks.model.measured import layout_of
from trainfeed.benchmarks.model.projection import Loader

ENCODED = {"read": 0.0001, "decode": 0.001, "augment": 0.0005, "samples": 64, "stored_bytes_per_sample": 3000,
           "pixel_bytes_per_sample": 12288}


@pytest.mark.parametrize("rec,moved,size", [
    # 100 samples of 72,000 B: the pass moved 8,093,176 B (metadata, a partly filled last chunk)
    (cell("hdf5", sample_bytes=72_000, requests={"gets": 5, "bytes": 8_093_176}), 80_931.76, 72_000),
    # a compressed store holds fewer bytes than its samples' data: what it moved, overhead and all
    (cell("parquet", sample_bytes=4000, requests={"gets": 1, "bytes": 250_000}), 2500, 2500),
    # JPEGs: 3,000 B stored of 12,288 B of pixels; the pass moved 3,400 B a sample
    (cell("parquet-encoded", sample_bytes=12_288, stages=ENCODED, requests={"gets": 1, "bytes": 340_000}), 3400,
     3000),
    # no request counters (local disk as it is): the sample's bytes both ways
    (cell("delta", sample_bytes=4000), 4000, 4000),
])
def test_a_samples_bytes_at_rest_leave_the_stores_overhead_out(rec, moved, size):
    layout = layout_of(rec)
    assert (layout.bytes_per_sample, layout.dataset_bytes_per_sample) == (pytest.approx(moved), size)


def test_whether_an_epoch_fits_in_ram_follows_the_samples_bytes():
    """1,000,000 samples of 72,000 B: 67.1 GiB, within 80% of 90 GiB (72.0); at the 80,932 B the
    pass moved a sample it would be 75.4 GiB, and would not fit."""
    hdf5 = cell("hdf5", "cpu", node_kind="real", cpu_step_s=1.0, sample_bytes=72_000,
                requests={"gets": 5, "bytes": 8_093_176})
    (row,) = project_catalog([hdf5], [inst("c8", 8, ram_gib=90)], "hdf5", Loader(), None, Workload(1_000_000, 1))
    assert row["ram_note"] == "dataset (67.1 GiB) fits in 80% of RAM (72.0 of 90 GiB)"
