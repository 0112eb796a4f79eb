"""The format registry: every registered format is an object implementing ``interface.Format``
(checked here at run time, and by mypy where it is installed), what the registry derives from
the formats' declarations matches what their writers write, and every writable format
round-trips, with every codec it offers, through both of its read paths (what --verify reads and
what training reads). A new format is one module (with its Format object) plus its entry in
registry.BUILT_IN (tests/converters/formats/test_toy_format.py adds one at run time)."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import numpy as np
import pytest

from trainfeed.converters.formats.foreign_table import READER
from trainfeed.converters.formats.interface import Format, OpenFiles, PieceReader, VersionedFormat
from trainfeed.converters.formats.options import OpenOptions, WriteOptions
from trainfeed.converters.formats.registry import (
    FORMATS,
    IN_PLACE,
    PART,
    RUN_PART,
    WRITABLE,
    detect_format,
    identify,
    table_formats,
    versioned_format,
)
from trainfeed.converters.layout import MANIFEST, DatasetSchema, FieldSpec
from trainfeed.converters.publish import _tagged
from trainfeed.converters.sources.decode import Sample

ROOT = Path(__file__).resolve().parents[3]
CAPABILITIES = ("writable", "versioned", "in_place", "parquet_files", "fetches_ahead", "single_file")


def _methods(protocol: type) -> list[str]:
    return sorted(name for name, value in vars(protocol).items()
                  if inspect.isfunction(value) and not name.startswith("_"))


def _shape(fn) -> list[tuple]:
    """A method's parameters as a caller sees them (bound: without ``self``): names, kinds,
    whether each has a default."""
    return [(p.name, p.kind, p.default is inspect.Parameter.empty) for p in inspect.signature(fn).parameters.values()]


def _takes(method, interface) -> bool:
    """Whether a format's bound ``method`` takes what the interface's says: the same parameters
    first, then only parameters with defaults (Delta's ``read_schema`` also takes a version)."""
    theirs, ours = _shape(method), _shape(interface)[1:]
    return theirs[:len(ours)] == ours and all(not required for _, _, required in theirs[len(ours):])


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format_implements_the_interface(fmt):
    f = FORMATS[fmt]
    assert isinstance(f, Format)  # every member present
    assert f.name == fmt and all(isinstance(getattr(f, a), str) and getattr(f, a) for a in ("label", "noun", "UNIT"))
    assert all(isinstance(getattr(f, c), bool) for c in CAPABILITIES)
    protocol = VersionedFormat if f.versioned else Format
    assert f.versioned == isinstance(f, VersionedFormat) and (versioned_format(fmt) is f) == f.versioned
    for name in _methods(protocol) + _methods(Format) + _methods(PieceReader):  # each the interface's signature
        assert _takes(getattr(f, name), getattr(protocol, name)), f"{fmt}.{name}"
    if f.writable:
        assert f.DEFAULT_COMPRESSION in f.COMPRESSIONS and set(f.COMPRESSION_LEVELS) <= set(f.COMPRESSIONS)
        assert f.commit_record and f.part_names and f.run_part_names and f.suffixes
    if f.single_file or f.commit_record not in (None, MANIFEST):  # identify names what trainfeed did not write
        assert f.foreign_noun
    if f.fetches_ahead:  # then it says which bytes a piece's read fetches
        assert type(f).piece_span is not Format.piece_span


def test_the_registry_is_what_the_formats_declare():
    assert [name for name, f in FORMATS.items() if f.writable] == WRITABLE
    assert {"parquet", "delta", "hdf5"} <= set(WRITABLE) and "blob" in FORMATS and "blob" not in WRITABLE
    assert IN_PLACE == "blob" and [f.name for f in FORMATS.values() if f.in_place] == [IN_PLACE]
    assert [f.name for f in FORMATS.values() if f.versioned] == ["delta"]
    assert table_formats() == table_formats(writable=True) == ["parquet", "delta"]  # the Spark repack's --to
    assert isinstance(READER, PieceReader) and not isinstance(READER, Format)


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
    completed: list[str] = []
    module.write(dst, schema, iter([batch[i:i + 10] for i in range(0, 50, 10)]), opts, completed.append)
    assert module.is_store(dst) and detect_format(dst) == fmt
    assert module.written_by_trainfeed(dst) and identify(dst).fmt == fmt
    assert module.read_schema(dst).samples == 50
    # the names the registry derives from the format's declarations are its writer's
    names = [Path(f).name for f in module.data_files(dst)]
    assert len(names) > 1 and sorted(completed) == sorted(names)
    assert all(n.endswith(module.suffixes) and re.fullmatch(module.part_names, n) and PART.fullmatch(n) for n in names)
    uploaded = names if module.commit_record != MANIFEST else [_tagged(n, "0123abcd") for n in names]  # publish.py's
    assert all(re.fullmatch(module.run_part_names, n) and RUN_PART.fullmatch(n) for n in uploaded)
    assert (dst / module.commit_record).exists()
    # what --verify reads
    rows = {sid: (label, fields["volume"]) for sid, label, fields in module.read_samples(dst)}
    assert sorted(rows) == sorted(truth)
    for sid, s in truth.items():
        assert rows[sid][0] == s.label and rows[sid][1].tobytes() == s.fields["volume"].tobytes()
    # what training reads: the same samples, piece by piece
    listing = module.list_pieces(dst, OpenOptions())
    assert len(listing.pieces) > 1 and sum(listing.rows) == 50
    seen = {}
    for piece, n in zip(listing.pieces, listing.rows):
        cols = module.read_piece(listing, piece, OpenFiles())
        assert len(cols.ids) == len(cols.labels) == len(cols.x) == n
        assert module.piece_span(listing, piece) is None  # local: nothing to fetch ahead
        for sid, label, x in zip(cols.ids, cols.labels, cols.x):
            seen[sid] = (int(label), x.tobytes())
    assert seen == {sid: (s.label, s.fields["volume"].tobytes()) for sid, s in truth.items()}
    assert sorted(np.concatenate(list(module.read_labels(listing))).tolist()) == sorted(s.label for s in batch)
