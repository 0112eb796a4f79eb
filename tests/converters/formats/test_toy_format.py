"""Adding a format takes its object and the registry's public API only: a toy read-only format
(one JSON-lines file per store) registered here is detected, opened by ``trainfeed.open_store``
and read bit for bit through ``Store.batches()`` and a DataLoader with two workers; once
unregistered, nothing knows it. No existing module is touched."""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import trainfeed
from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats.interface import Columns, Empty, Format, OpenFiles, Pieces, Where
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import FORMATS, detect_format, register_format, registered
from trainfeed.converters.layout import DatasetSchema, FieldSpec
from trainfeed.converters.storage.location import as_location

SUFFIX = ".toyl"
MARK = {"toy-lines": 1}  # the first line of a store: what identifies one
SHAPE = (2, 3)
#: A piece: lines ``start:stop`` of the store's file (after its mark).
Span = tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class LinePieces(Pieces[Span]):
    """The toy format's listing: its state is the store's samples, parsed once (a toy store is small)."""

    records: list[dict[str, object]]


class ToyLines(Format[Span, LinePieces]):
    """One ``.toyl`` file per store: a mark line, then one JSON object per sample."""

    name, label, noun = "toyl", "toy lines", "a toy-lines file"
    UNIT = "line runs"

    def is_store(self, path: Where) -> bool:
        file = Path(as_location(path).path)
        if file.suffix != SUFFIX or not file.is_file():
            return False
        with file.open() as f:
            return bool(json.loads(f.readline() or "null") == MARK)

    def written_by_trainfeed(self, path: Where) -> bool:
        return False

    def list_pieces(self, path: Where, options: OpenOptions) -> LinePieces:
        file = as_location(path, options.storage_options).path
        records = [json.loads(line) for line in Path(file).read_text().splitlines()[1:]]
        schema = DatasetSchema([FieldSpec("x", "float32", SHAPE)], labeled=True, label_map=None, samples=len(records))
        spans = [(start, min(len(records), start + 4)) for start in range(0, len(records), 4)]
        return LinePieces(schema=schema, spec=schema.fields[0], pieces=spans, rows=[b - a for a, b in spans],
                          files=[file], records=records)

    def read_piece(self, listing: LinePieces, piece: Span, handles: OpenFiles, empty: Empty = np.empty) -> Columns:
        rows = listing.records[piece[0]:piece[1]]
        x = empty((len(rows), *SHAPE), np.float32)
        x[...] = [np.frombuffer(bytes.fromhex(str(r["x"])), "<f4").reshape(SHAPE) for r in rows]
        return Columns([str(r["id"]) for r in rows], np.array([r["label"] for r in rows], np.int64), x)

    def piece_file(self, piece: Span) -> str:
        return f"lines {piece[0]}:{piece[1]}"

    def read_labels(self, listing: LinePieces) -> Iterator[np.ndarray]:
        yield np.array([r["label"] for r in listing.records], np.int64)


TOY = ToyLines()


@pytest.fixture
def toy_store(tmp_path: Path) -> tuple[Path, dict[str, tuple[int, bytes]]]:
    """A toy store of 22 samples (NaN payloads and -0.0 included: bits, not values, compared)."""
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((22, *SHAPE)).astype(np.float32)
    xs[0, 0, 0], xs[1, 0, 1] = np.float32("nan"), np.float32(-0.0)
    truth = {f"s{i:02d}": (i % 3, xs[i].tobytes()) for i in range(22)}
    lines = [json.dumps(MARK)] + [json.dumps({"id": sid, "label": label, "x": x.hex()})
                                  for sid, (label, x) in truth.items()]
    path = tmp_path / f"samples{SUFFIX}"
    path.write_text("\n".join(lines) + "\n")
    return path, truth


def test_a_toy_format_is_detected_opened_and_read_bit_for_bit(toy_store):
    path, truth = toy_store
    assert detect_format(path) is None and TOY.name not in FORMATS
    with registered(TOY):
        assert detect_format(path) == TOY.name and FORMATS[TOY.name] is TOY
        store = trainfeed.open_store(str(path))
        assert store.format == TOY.name and store.samples == 22 and store.shape == SHAPE
        got = {}
        for batch in store.batches(batch_size=5, seed=3):
            for sid, label, x in zip(batch.ids, batch.y, batch.x):
                got[sid] = (int(label), x.tobytes())
        assert got == truth
        loader = DataLoader(trainfeed.TorchDataset(store, batch_size=5, seed=3), batch_size=None, num_workers=2)
        delivered = sorted((int(label), x.numpy().tobytes()) for xb, yb in loader for x, label in zip(xb, yb))
        assert delivered == sorted(truth.values())  # every sample once, bit for bit, from two worker processes
        assert all(isinstance(xb, torch.Tensor) for xb, _ in loader)
    assert TOY.name not in FORMATS and detect_format(path) is None


def test_the_registry_refuses_what_is_no_format_or_a_taken_name():
    with pytest.raises(UsageError, match="already registered"):
        register_format(FORMATS["parquet"])
    with pytest.raises(UsageError, match="not a Format"):
        register_format(object())  # type: ignore[arg-type]
    assert list(FORMATS) == ["parquet", "delta", "hdf5", "blob"]
