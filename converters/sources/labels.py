"""Where labels come from: a CSV (id,label), class subfolders, or nowhere (unlabeled)."""
from __future__ import annotations

import csv
import io
import os
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
from fsspec.exceptions import FSTimeoutError

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.sources.listing import SourceFile
from trainfeed.converters.storage.config import call_timeout, no_answer
from trainfeed.converters.storage.filesystems import call, is_local, open_fs

#: An integer label: ASCII digits only (int() would also take "1_000" or Arabic-Indic digits).
_INTEGER = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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


def _index_classes(names: set[str], classes: Sequence[str] | None = None, where: str = "") -> dict[str, int]:
    """Class name -> label: sorted names, or ``classes`` in the order given (``--classes``: a
    held-out set missing a class numbers the others as the training set does)."""
    if classes is None:
        return {name: i for i, name in enumerate(sorted(names))}
    unknown = sorted(names - set(classes))
    if unknown:
        raise TrainfeedError(f"{where}: class {unknown[0]!r} is not in --classes ({', '.join(classes)})")
    return {name: i for i, name in enumerate(classes)}


def _read_bytes(fs: fsspec.AbstractFileSystem, path: str, deadline: float | None) -> bytes:
    """The whole file; a local one with plain ``open`` so that a pipe (``--labels <(...)``) works."""
    if is_local(fs):
        with open(path, "rb") as fh:
            return fh.read()
    data: bytes = call(fs, "cat_file", path, deadline=deadline)
    return data


def _read_text(url: str, storage_options: dict[str, Any] | None) -> str:
    fs, path = open_fs(url, storage_options)
    deadline = call_timeout(storage_options)
    try:
        return _read_bytes(fs, path, deadline).decode("utf-8-sig")
    except FileNotFoundError as exc:
        raise TrainfeedError(f"{url}: labels file not found") from exc
    except FSTimeoutError as exc:
        raise TrainfeedError(no_answer(url, deadline)) from exc
    except UnicodeDecodeError as exc:
        raise TrainfeedError(f"{url}: cannot read labels file: not UTF-8 text ({exc})") from exc
    except Exception as exc:  # OSError locally; remote stores raise their own types
        raise TrainfeedError(f"{url}: cannot read labels file: {exc}") from exc


def _check_header(url: str, fieldnames: Sequence[str] | None) -> None:
    columns = [c.strip() for c in fieldnames or []]
    if not {"id", "label"} <= set(columns):
        raise TrainfeedError(f"{url}: labels file needs a header with columns 'id' and 'label' (found {fieldnames})")
    for name in ("id", "label"):
        if columns.count(name) > 1:
            raise TrainfeedError(f"{url}: header names column {name!r} {columns.count(name)} times "
                                 "(which one holds the labels?); keep one")


def _integer_labels(url: str, rows: list[tuple[int, str, str]]) -> dict[str, int]:
    out = {}
    for line, sid, label in rows:
        value = int(label)
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise TrainfeedError(f"{url}, line {line}: label {label} does not fit in a 64-bit integer")
        out[sid] = value
    return out


def _check_one_kind(url: str, rows: list[tuple[int, str, str]]) -> bool:
    """Whether the labels are integers (else class names); fails on the first row that
    breaks the first row's kind."""
    first_line, _, first = rows[0]
    integers = bool(_INTEGER.fullmatch(first))
    for line, _, label in rows:
        if bool(_INTEGER.fullmatch(label)) != integers:
            kinds = ("a class name", "the integer label") if integers else ("an integer", "the class name")
            raise TrainfeedError(f"{url}, line {line}: label {label!r} is {kinds[0]}, but line {first_line} has "
                                 f"{kinds[1]} {first!r}; use integer labels or class names throughout")
    return integers


def read_label_csv(url: str, storage_options: dict[str, Any] | None = None, classes: Sequence[str] | None = None
                   ) -> tuple[dict[str, int], dict[str, int] | None]:
    """id -> label from a CSV with columns id,label. Labels are all integers (int64), or all
    class names, indexed in sorted order or in the order of ``classes`` (the map is returned
    and stored with the data)."""
    reader = csv.DictReader(io.StringIO(_read_text(url, storage_options)))
    _check_header(url, reader.fieldnames)
    rows: list[tuple[int, str, str]] = []
    first_line: dict[str, int] = {}
    for row in reader:
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k is not None}
        line = reader.line_num
        sid, label = row.get("id", ""), row.get("label", "")
        if not sid:
            raise TrainfeedError(f"{url}, line {line}: empty id")
        if not label:
            raise TrainfeedError(f"{url}, line {line}: empty label for id {sid!r}")
        if sid in first_line:
            raise TrainfeedError(f"{url}, line {line}: id {sid!r} is listed twice (first on line {first_line[sid]})")
        first_line[sid] = line
        rows.append((line, sid, label))
    if not rows:
        raise TrainfeedError(f"{url}: labels file has no rows")
    if _check_one_kind(url, rows):
        if classes is not None:
            raise TrainfeedError(f"{url}: labels are integers; --classes names class names (leave it out)")
        return _integer_labels(url, rows), None
    label_map = _index_classes({label for _, _, label in rows}, classes, url)
    return {sid: label_map[label] for _, sid, label in rows}, label_map


def resolve_labels(
    files: list[SourceFile],
    *,
    labels_csv: str | None,
    folder_labels: bool = True,
    storage_options: dict[str, str] | None = None,
    classes: Sequence[str] | None = None,
) -> Labels:
    """Labels for every file, from the CSV if given, else from class subfolders if every file
    sits in one and there are at least two (one is enough with ``classes``), else none.
    ``classes``: the class names in label order, for names from the CSV or the folders."""
    files = [f for f in files if f.problem is None]  # rejected for what they are, whatever their label
    if labels_csv:
        by_id, label_map = read_label_csv(labels_csv, storage_options, classes)
        ids = {f.id for f in files}
        missing = [f.id for f in files if f.id not in by_id]
        unmatched = sorted(set(by_id) - ids)
        return Labels({k: v for k, v in by_id.items() if k in ids}, label_map, "csv", missing, unmatched)
    if folder_labels and files and all("/" in f.id for f in files):
        folders = {f.id.split("/", 1)[0] for f in files}
        if len(folders) >= 2 or classes is not None:
            label_map = _index_classes(folders, classes, files[0].path.rsplit("/", 2)[0])
            return Labels({f.id: label_map[f.id.split("/", 1)[0]] for f in files}, label_map, "folders")
    if classes is not None:
        raise TrainfeedError("--classes names the classes of a labels CSV or of class subfolders; this source has "
                             "neither")
    return Labels(None)


def parse_classes(text: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``--classes neg,pos`` (or a list) as class names in label order, each once."""
    if text is None:
        return None
    names = tuple(n.strip() for n in (text.split(",") if isinstance(text, str) else text))
    if not names or not all(names) or len(set(names)) != len(names):
        raise UsageError(f"--classes takes class names joined by commas, each once (label 0 first), not {text!r}")
    return names


#: The labels file `convert` and `storage-bench run` take from SRC when --labels is not given
#: (`storage-bench generate` writes it there).
LABELS_FILE = "labels.csv"


def labels_in_source(src: str, storage_options: dict[str, Any] | None = None) -> str | None:
    """SRC/labels.csv when it is a file, else None (also when SRC cannot be reached: the
    conversion then says why)."""
    if "://" not in src or src.startswith("file://"):
        path = os.path.join(src.removeprefix("file://"), LABELS_FILE)
        return path if os.path.isfile(path) else None
    try:
        fs, root = open_fs(src, storage_options)
        found = call(fs, "isfile", posixpath.join(root.rstrip("/"), LABELS_FILE),
                     deadline=call_timeout(storage_options))
    except Exception:
        return None
    return src.rstrip("/") + "/" + LABELS_FILE if found else None
