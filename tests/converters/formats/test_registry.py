"""The format registry: every registered module provides the whole interface, and every writable
format round-trips, with every codec it offers, through both of its read paths (what --verify
reads and what training reads). A new format is one module plus its line in FORMATS."""
from __future__ import annotations

import numpy as np
import pytest

from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.converters.formats.options import ReadRequest, WriteOptions
from trainfeed.converters.sources.decode import Sample
from trainfeed.converters.formats.registry import FORMATS, WRITABLE, detect_format

READ_SIDE = ("name", "label", "writable", "UNIT", "list_pieces", "read_piece", "read_labels", "piece_file")
WRITE_SIDE = ("write", "read_schema", "read_samples", "is_store", "COMPRESSIONS", "DEFAULT_COMPRESSION",
              "COMPRESSION_LEVELS")


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_module_provides_the_interface(fmt):
    module = FORMATS[fmt]
    assert module.name == fmt and isinstance(module.label, str) and isinstance(module.writable, bool)
    missing = [a for a in READ_SIDE + (WRITE_SIDE if module.writable else ()) if not hasattr(module, a)]
    assert not missing, f"{module.__name__} lacks {missing}"
    if module.writable:
        assert module.DEFAULT_COMPRESSION in module.COMPRESSIONS
        assert set(module.COMPRESSION_LEVELS) <= set(module.COMPRESSIONS)


def test_writable_formats_are_the_registry_s():
    assert WRITABLE == [name for name, m in FORMATS.items() if m.writable]
    assert {"parquet", "delta", "hdf5"} <= set(WRITABLE) and "blob" in FORMATS and "blob" not in WRITABLE


def _samples(n: int) -> dict[str, Sample]:
    rng = np.random.default_rng(4)
    return {f"s{i:03d}": Sample(f"s{i:03d}", i % 3, {"volume": rng.standard_normal((3, 4, 2)).astype(np.float32)})
            for i in range(n)}


CODECS = [(fmt, codec) for fmt in WRITABLE for codec in FORMATS[fmt].COMPRESSIONS]


@pytest.mark.parametrize("fmt,codec", CODECS)
def test_round_trip_through_the_registry(tmp_path, fmt, codec):
    module = FORMATS[fmt]
    truth = _samples(50)
    schema = DatasetSchema([FieldSpec("volume", "float32", (3, 4, 2))], labeled=True, label_map=None)
    batch = list(truth.values())
    dst = tmp_path / "store"
    opts = WriteOptions(target_file_size=1_000, row_group_size=10 * 96, hdf5_chunk_size=5 * 96, compression=codec)
    module.write(dst, schema, iter([batch[i:i + 10] for i in range(0, 50, 10)]), opts)
    assert module.is_store(dst) and detect_format(dst) == fmt
    assert module.read_schema(dst).samples == 50
    # what --verify reads
    rows = {sid: (label, fields["volume"]) for sid, label, fields in module.read_samples(dst)}
    assert sorted(rows) == sorted(truth)
    for sid, s in truth.items():
        assert rows[sid][0] == s.label and rows[sid][1].tobytes() == s.fields["volume"].tobytes()
    # what training reads: the same samples, piece by piece
    listing = module.list_pieces(dst, ReadRequest())
    assert len(listing.pieces) > 1 and sum(listing.rows) == 50
    seen = {}
    for piece, n in zip(listing.pieces, listing.rows):
        cols = module.read_piece(listing, piece, {})
        assert len(cols.ids) == len(cols.labels) == len(cols.x) == n
        for sid, label, x in zip(cols.ids, cols.labels, cols.x):
            seen[sid] = (int(label), x.tobytes())
    assert seen == {sid: (s.label, s.fields["volume"].tobytes()) for sid, s in truth.items()}
    assert sorted(np.concatenate(list(module.read_labels(listing))).tolist()) == sorted(s.label for s in batch)
