"""The manifest, ``_trainfeed.json``: the commit record of a folder store whose format has no log
of its own (Parquet, sharded HDF5). It names the store's format, its writer, its dataset schema
and its data files with their row counts.

It is trainfeed's mark on such a store: readers take exactly the parts it lists and validate
it, and ``convert --overwrite`` replaces only folders that carry a valid one."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfeed.converters import __version__
from trainfeed.converters.layout import MANIFEST, DatasetSchema, checked_schema, is_count
from trainfeed.converters.storage.location import as_location

if TYPE_CHECKING:
    from trainfeed.converters.formats.interface import Where

#: What a store's ``writer`` says (a manifest's, an HDF5 file's root attribute).
WRITER = f"trainfeed {__version__}"


def write_manifest(path: Path, fmt: str, schema: DatasetSchema, parts: list[dict[str, Any]],
                   writer: str = WRITER) -> None:
    """The manifest of a ``fmt`` store at ``path``: ``parts`` are {"file": NAME, "rows": N}."""
    manifest = {"format": fmt, "writer": writer, "schema": schema.to_dict(), "parts": parts}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=1))


def read_manifest(path: Where, fmt: str | tuple[str, ...]) -> dict[str, Any]:
    """The validated manifest of the store at ``path`` (a local path or a Location); ValueError
    naming the file if it is missing, unreadable, not what trainfeed writes, or of a format
    other than ``fmt`` (one name, or the names it may say)."""
    loc = as_location(path)
    file = f"{loc.shown}/{MANIFEST}"
    names = (fmt,) if isinstance(fmt, str) else fmt
    raw = b""
    try:
        raw = loc.read_bytes(MANIFEST)
        manifest = json.loads(raw)
    except FileNotFoundError as exc:
        raise ValueError(f"{loc.shown}: no {MANIFEST}: not a complete trainfeed {' or '.join(names)} store") from exc
    except OSError as exc:
        raise ValueError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{file}: not valid JSON ({'empty file' if not raw else exc})") from exc
    if not isinstance(manifest, dict):
        raise ValueError(f"{file}: holds a JSON {type(manifest).__name__}, not the manifest object")
    found = manifest.get("format")
    if found not in names:
        raise ValueError(f"{file}: says format {found!r}, not {' or '.join(names)}")
    writer = manifest.get("writer")
    if not (isinstance(writer, str) and writer.startswith("trainfeed ")):
        raise ValueError(f"{file}: not written by trainfeed (writer {writer!r})")
    checked_schema(manifest.get("schema"), file)
    _check_parts(manifest.get("parts"), file)
    return manifest


def _check_parts(parts: Any, file: str) -> None:
    if not isinstance(parts, list):
        raise ValueError(f"{file}: 'parts' must be a list of {{\"file\": NAME, \"rows\": N}}")
    for i, part in enumerate(parts):
        name = part.get("file") if isinstance(part, dict) else None
        rows = part.get("rows") if isinstance(part, dict) else None
        plain_name = isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
        if not (plain_name and is_count(rows)):
            raise ValueError(f"{file}: part {i} is {part!r}, not {{\"file\": NAME, \"rows\": N}}")
