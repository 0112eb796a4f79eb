"""Where labels come from: a CSV (id,label), class subfolders, or nowhere (unlabeled)."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field

import fsspec

from .errors import TrainfeedError
from .sources import SourceFile


@dataclass
class Labels:
    """Label per sample id; ``missing`` are source ids the labels do not cover."""

    by_id: dict[str, int] | None  # None: unlabeled store
    label_map: dict[str, int] | None = None
    origin: str = "none"  # "csv", "folders" or "none"
    missing: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # CSV ids with no source file

    def get(self, sample_id: str) -> int | None:
        return None if self.by_id is None else self.by_id[sample_id]


def _index_classes(names: set[str]) -> dict[str, int]:
    return {name: i for i, name in enumerate(sorted(names))}


def read_label_csv(url: str, storage_options: dict[str, str] | None = None) -> tuple[dict[str, int], dict[str, int] | None]:
    """id -> label from a CSV with columns id,label. Labels that are not all integers are
    class names, indexed in sorted order (the map is returned and stored with the data)."""
    try:
        with fsspec.open(url, "rb", **(storage_options or {})) as fh:
            text = fh.read().decode("utf-8-sig")
    except FileNotFoundError as exc:
        raise TrainfeedError(f"{url}: labels file not found") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise TrainfeedError(f"{url}: cannot read labels file: {exc}") from exc
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or not {"id", "label"} <= {c.strip() for c in reader.fieldnames}:
        raise TrainfeedError(f"{url}: labels file needs a header with columns 'id' and 'label' (found {reader.fieldnames})")
    raw: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for row in reader:
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
        line = reader.line_num
        sid, label = row.get("id", ""), row.get("label", "")
        if not sid:
            raise TrainfeedError(f"{url}, line {line}: empty id")
        if not label:
            raise TrainfeedError(f"{url}, line {line}: empty label for id {sid!r}")
        if sid in raw:
            raise TrainfeedError(f"{url}, line {line}: id {sid!r} is listed twice (first on line {first_line[sid]})")
        raw[sid], first_line[sid] = label, line
    if not raw:
        raise TrainfeedError(f"{url}: labels file has no rows")
    try:
        return {k: int(v) for k, v in raw.items()}, None
    except ValueError:
        label_map = _index_classes(set(raw.values()))
        return {k: label_map[v] for k, v in raw.items()}, label_map


def resolve_labels(
    files: list[SourceFile],
    *,
    labels_csv: str | None,
    folder_labels: bool = True,
    storage_options: dict[str, str] | None = None,
) -> Labels:
    """Labels for every file, from the CSV if given, else from class subfolders if every file
    sits in one and there are at least two, else none."""
    if labels_csv:
        by_id, label_map = read_label_csv(labels_csv, storage_options)
        ids = {f.id for f in files}
        missing = [f.id for f in files if f.id not in by_id]
        unmatched = sorted(set(by_id) - ids)
        return Labels({k: v for k, v in by_id.items() if k in ids}, label_map, "csv", missing, unmatched)
    if folder_labels and all("/" in f.id for f in files):
        classes = {f.id.split("/", 1)[0] for f in files}
        if len(classes) >= 2:
            label_map = _index_classes(classes)
            return Labels({f.id: label_map[f.id.split("/", 1)[0]] for f in files}, label_map, "folders")
    return Labels(None)
