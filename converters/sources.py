"""Small-file sources: list a folder (local path or fsspec URL), read and decode each sample.

A source is a folder of ``.npy`` files (one array each, field ``volume``), of ``.npz`` files
(each array a field) or of JPEG/PNG images (field ``image``). A sample's id is its path
relative to the folder without the extension, with ``/`` separators.
"""
from __future__ import annotations

import io
import posixpath
import zipfile
from dataclasses import dataclass, field

import fsspec
import numpy as np
from numpy.lib import format as npformat
from PIL import Image, UnidentifiedImageError

from .errors import SampleError, TrainfeedError, UsageError
from .layout import IMAGE_BYTES, RAW, RESERVED, SUPPORTED_DTYPES

NPY, NPZ, IMAGE = "npy", "npz", "image"

VOLUME_FIELD, IMAGE_FIELD = "volume", "image"
_EXTENSIONS = {".npy": NPY, ".npz": NPZ, ".jpg": IMAGE, ".jpeg": IMAGE, ".png": IMAGE}


@dataclass(frozen=True)
class SourceFile:
    id: str
    path: str  # path inside the filesystem
    size: int


@dataclass
class Sample:
    id: str
    label: int | None
    fields: dict[str, np.ndarray | bytes]
    nbytes_in: int = 0  # bytes read from the source file

    @property
    def nbytes(self) -> int:
        """Bytes of tensor payload as stored (decoded arrays, or encoded image bytes)."""
        return sum(v.nbytes if isinstance(v, np.ndarray) else len(v) for v in self.fields.values())


@dataclass(frozen=True)
class ImageOptions:
    resize: tuple[int, int] | None = None  # (height, width)
    storage: str = "encoded"  # "encoded" keeps JPEG/PNG bytes; "decoded" stores uint8 arrays
    mode: str = "RGB"  # PIL mode images are converted to when decoded or resized


@dataclass
class Listing:
    kind: str
    files: list[SourceFile]
    ignored: list[str] = field(default_factory=list)


def open_fs(url: str, storage_options: dict[str, str] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """fsspec filesystem and root path for a local path or a URL (abfs://, az://, s3://, gs://, ...)."""
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise UsageError(f"{url}: cannot open this location: {exc}") from exc


def list_source(url: str, storage_options: dict[str, str] | None = None) -> tuple[fsspec.AbstractFileSystem, Listing]:
    """All sample files under ``url``, sorted by id. Fails on an empty or mixed folder."""
    fs, root = open_fs(url, storage_options)
    try:
        if not fs.isdir(root):
            raise TrainfeedError(f"{url}: source folder does not exist or is not a folder")
        entries = fs.find(root, detail=True)
    except TrainfeedError:
        raise
    except Exception as exc:  # remote stores raise their own types
        raise TrainfeedError(f"{url}: cannot list source folder: {exc}") from exc
    root = root.rstrip("/")
    by_kind: dict[str, list[SourceFile]] = {}
    ignored: list[str] = []
    seen: dict[str, str] = {}
    for path, info in sorted(entries.items()):
        rel = posixpath.relpath(path, root) if root else path
        if any(part.startswith(".") for part in rel.split("/")):
            continue  # hidden files and folders (.DS_Store, .ipynb_checkpoints)
        stem, ext = posixpath.splitext(rel)
        kind = _EXTENSIONS.get(ext.lower())
        if kind is None:
            ignored.append(rel)
            continue
        if stem in seen:
            raise TrainfeedError(f"{url}: files {seen[stem]!r} and {rel!r} map to the same sample id {stem!r}")
        seen[stem] = rel
        by_kind.setdefault(kind, []).append(SourceFile(stem, path, int(info.get("size") or 0)))
    if not by_kind:
        hint = f" ({len(ignored)} other files ignored)" if ignored else ""
        raise TrainfeedError(f"{url}: no .npy, .npz, .jpg, .jpeg or .png files found{hint}")
    if len(by_kind) > 1:
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(by_kind.items()))
        raise TrainfeedError(f"{url}: source mixes sample kinds ({counts}); convert one kind per store")
    (kind, files), = by_kind.items()
    return fs, Listing(kind, sorted(files, key=lambda f: f.id), ignored)


def read_bytes(fs: fsspec.AbstractFileSystem, src: SourceFile) -> bytes:
    try:
        data = fs.cat_file(src.path)
    except FileNotFoundError as exc:
        raise SampleError(src.path, "cannot read: file not found (broken link or deleted)") from exc
    except IsADirectoryError as exc:
        raise SampleError(src.path, "cannot read: is a directory") from exc
    except PermissionError as exc:
        raise SampleError(src.path, "cannot read: permission denied") from exc
    except OSError as exc:
        raise SampleError(src.path, f"cannot read: {exc.strerror or exc}") from exc
    if len(data) == 0:
        raise SampleError(src.path, "empty file (0 bytes)")
    return data


def _check_array(path: str, name: str, arr: np.ndarray) -> np.ndarray:
    if arr.dtype.name not in SUPPORTED_DTYPES:
        raise SampleError(path, f"array {name!r} has dtype {arr.dtype} (supported: {', '.join(SUPPORTED_DTYPES)})")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


_NPY_MAGIC, _ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"


def decode_npy(path: str, data: bytes) -> dict[str, np.ndarray]:
    """Parse the .npy header and view the payload in place (no copy of the tensor bytes)."""
    if not data.startswith(_NPY_MAGIC):
        what = "an .npz archive" if data.startswith(_ZIP_MAGIC) else "not a .npy file"
        raise SampleError(path, f"corrupt or truncated .npy: {what} (no NumPy header)")
    fp = io.BytesIO(data)
    try:
        version = npformat.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, fortran, dtype = npformat.read_array_header_2_0(fp)
        elif version == (3, 0):
            return {VOLUME_FIELD: _check_array(path, VOLUME_FIELD, np.load(io.BytesIO(data), allow_pickle=False))}
        else:
            raise SampleError(path, f"corrupt or truncated .npy: unknown format version {version}")
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise SampleError(path, "holds a pickled object array, which is not loaded for safety") from exc
        raise SampleError(path, f"corrupt or truncated .npy: {exc}") from exc
    if dtype.hasobject:
        raise SampleError(path, "holds a pickled object array, which is not loaded for safety")
    count = int(np.prod(shape, dtype=np.int64))
    offset = fp.tell()
    if len(data) - offset < count * dtype.itemsize:
        raise SampleError(path, f"corrupt or truncated .npy: header promises {count * dtype.itemsize} bytes of "
                                f"{dtype} {shape}, file holds {len(data) - offset}")
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    arr = arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)
    return {VOLUME_FIELD: _check_array(path, VOLUME_FIELD, arr)}


def decode_npz(path: str, data: bytes) -> dict[str, np.ndarray]:
    if not data.startswith(_ZIP_MAGIC):
        what = "a .npy array" if data.startswith(_NPY_MAGIC) else "not a zip archive"
        raise SampleError(path, f"corrupt or truncated .npz: {what}")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            names = list(npz.files)
            out = {name: _check_array(path, name, npz[name]) for name in names}
    except SampleError:
        raise
    except ValueError as exc:
        if "allow_pickle" in str(exc):
            raise SampleError(path, "holds a pickled object array, which is not loaded for safety") from exc
        raise SampleError(path, f"corrupt or truncated .npz: {exc}") from exc
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise SampleError(path, f"corrupt or truncated .npz: {exc}") from exc
    if not out:
        raise SampleError(path, ".npz archive holds no arrays")
    clash = [n for n in out if n in RESERVED]
    if clash:
        raise SampleError(path, f".npz array name {clash[0]!r} is reserved for the store's own column")
    return out


def decode_image(path: str, data: bytes, opts: ImageOptions) -> dict[str, np.ndarray | bytes]:
    """Decode fully (so corrupt files are caught), then keep bytes or pixels per ``opts``."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = img.format
            img.load()
            if opts.storage == "encoded" and opts.resize is None:
                return {IMAGE_FIELD: data}
            img = img.convert(opts.mode) if img.mode != opts.mode else img
            if opts.resize is not None:
                h, w = opts.resize
                img = img.resize((w, h), Image.Resampling.BILINEAR)
            if opts.storage == "decoded":
                return {IMAGE_FIELD: np.ascontiguousarray(np.asarray(img, dtype=np.uint8))}
            buf = io.BytesIO()
            if fmt == "PNG":
                img.save(buf, format="PNG")
            else:
                img.save(buf, format="JPEG", quality=95)
            return {IMAGE_FIELD: buf.getvalue()}
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise SampleError(path, f"undecodable image: {exc}") from exc


def image_shape(value: np.ndarray | bytes) -> tuple[int, ...]:
    """(height, width, channels) of an array or of encoded image bytes (header only)."""
    if isinstance(value, np.ndarray):
        return value.shape if value.ndim == 3 else (*value.shape, 1)
    with Image.open(io.BytesIO(value)) as img:
        return (img.height, img.width, len(img.getbands()))


def decode_sample(kind: str, path: str, data: bytes, image_opts: ImageOptions) -> dict[str, np.ndarray | bytes]:
    if kind == NPY:
        return decode_npy(path, data)
    if kind == NPZ:
        return decode_npz(path, data)
    return decode_image(path, data, image_opts)


def field_encoding(kind: str, image_opts: ImageOptions) -> str:
    return IMAGE_BYTES if kind == IMAGE and image_opts.storage == "encoded" else RAW
