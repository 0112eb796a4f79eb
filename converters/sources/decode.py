"""Small-file sources, decoding: a listed file's bytes into a sample's fields (.npy: ``volume``,
.npz: one field per array, JPEG/PNG: ``image``). Every header is checked with Python integers before
a byte of payload is trusted, and no .npy read goes past what its header promises."""
from __future__ import annotations

import io
import math
import threading
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import fsspec
import numpy as np
from numpy.lib import format as npformat
from PIL import Image, UnidentifiedImageError

from trainfeed.converters.errors import SampleError, UsageError
from trainfeed.converters.layout import IMAGE_BYTES, RAW, RESERVED, SUPPORTED_DTYPES
from trainfeed.converters.option_docs import option
from trainfeed.converters.sources.listing import IMAGE, NPY, NPZ, SourceFile, read_bytes

VOLUME_FIELD, IMAGE_FIELD = "volume", "image"


@dataclass
class Sample:
    id: str
    label: int | None
    fields: Mapping[str, np.ndarray | bytes]
    nbytes_in: int = 0  # bytes read from the source file
    depth_changed: bool = False  # an image taken at another bit depth (--reduce-depth, --promote-depth)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor payload as stored (decoded arrays, or encoded image bytes)."""
        return sum(v.nbytes if isinstance(v, np.ndarray) else len(v) for v in self.fields.values())


@dataclass(frozen=True)
class ImageOptions:
    resize: tuple[int, int] | None = option(None, help="Resize images once, at conversion, to HEIGHTxWIDTH (e.g. "
                                            "64x64). Default: keep the original size.")
    storage: str = option("encoded", flag="image-storage", help="encoded: keep JPEG/PNG bytes (small store, decode "
                          "at read time). decoded: store pixel arrays, uint8 (uint16 for 16-bit greyscale PNGs, with "
                          "image mode L) (larger store, no decode cost when training).")
    mode: str = option("RGB", flag="image-mode", help="PIL mode images are converted to when decoded or resized: RGB "
                       "or L (grayscale).")
    reduce_depth: bool = option(False, help="Take a 16-bit image that cannot keep its bits (a colour PNG decoded or "
                                "resized, a grayscale one in image mode RGB) at 8 bits per channel instead of refusing "
                                "it: greyscale scaled by the image's own maximum (a 12-bit CT slice keeps 256 grey "
                                "levels, not 16), colour as Pillow decodes it (each value's high byte); the summary "
                                "counts the images changed.")
    promote_depth: bool = option(False, help="With image mode L: store 8-bit greyscale images as 16-bit (each value "
                                 "x 257, exact: value // 257 gives it back), so a folder mixing 8- and 16-bit "
                                 "greyscale images keeps every bit (encoded: they are re-encoded as 16-bit PNG); the "
                                 "summary counts the images changed.")


@dataclass(frozen=True)
class ArrayOptions:
    """How arrays (.npy, .npz) are stored: ``ragged`` keeps each sample's own shape (else every
    sample must have the first one's); ``dtype`` stores every sample in that dtype where no
    value changes (else the first sample's dtype, and a sample of another is refused);
    ``channels`` records the axis of the channels (``first`` or ``last``; None: not said)."""

    ragged: bool = option(False, help="Arrays (.npy, .npz): keep each sample in its own shape (stored beside it; "
                          "docs/LAYOUT.md) instead of refusing a sample whose shape differs from the first one's. "
                          "Reading batches them as you choose: a fit (train --fit, fit= in the API).")
    dtype: str | None = option(None, help="Arrays: store every sample as this numpy dtype (e.g. int32 for int16 "
                               "beside uint16 samples); a sample with a value the dtype cannot hold exactly is "
                               "refused, naming its file. auto (.npy): the smallest dtype that holds every file's "
                               "dtype exactly, found in their headers first (one short read each). Default: the first "
                               "sample's dtype, and a sample of another is refused with the dtype that holds both.")
    channels: str | None = option(None, help="Arrays: where the channel axis is, recorded in the store: last (H, W, "
                                  "C) or (X, Y, Z, C), what trainfeed's models take and the default; or first (C, H, "
                                  "W), PyTorch's order, which train moves to the end. Without it, a shape that looks "
                                  "channels-first gets a warning.")


def parse_resize(text: str | None, option: str = "--resize") -> tuple[int, int] | None:
    """``"HEIGHTxWIDTH"`` (``--resize``, ``--image-size``, ...) as ``(height, width)``; None stays None."""
    if text is None:
        return None
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"{option} expects HEIGHTxWIDTH such as 64x64, got {text!r}")
    return int(parts[0]), int(parts[1])


# ---------------------------------------------------------------- arrays

_DTYPE_KINDS = {"c": "complex numbers", "M": "dates and times", "m": "time spans", "U": "text",
                "S": "byte strings", "V": "raw bytes or records"}


def dtype_problem(dtype: np.dtype) -> str | None:
    """Why arrays of ``dtype`` cannot be stored; None when they can."""
    if dtype.hasobject:
        return "holds a pickled object array, which is not loaded for safety"
    if dtype.name in SUPPORTED_DTYPES:
        return None
    what = ("records (a structured dtype)" if dtype.names
            else _DTYPE_KINDS.get(dtype.kind, "numbers no store holds exactly"))
    return f"dtype {dtype} ({what}) is not supported (supported: {', '.join(SUPPORTED_DTYPES)})"


def _native_c(arr: np.ndarray) -> np.ndarray:
    """``arr`` in native byte order and C order (a copy only where it is not already)."""
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


_NPY_MAGIC, _ZIP_MAGIC, _PNG_MAGIC = b"\x93NUMPY", b"PK\x03\x04", b"\x89PNG\r\n\x1a\n"
#: A .npy file up to this size is read in one request; a larger one (or one of unknown size)
#: in two: its first bytes (numpy headers are at most ~10 KB), then exactly the payload its
#: header promises.
NPY_ONE_READ, NPY_HEADER_READ = 1 << 20, 64 << 10
#: numpy parses .npy headers with ``ast.literal_eval``; CPython 3.11/3.12 keep the AST
#: converter's recursion counter per interpreter, so two threads parsing at once can fail
#: with "SystemError: AST constructor recursion depth mismatch" (CPython gh-106905).
_HEADER_PARSE = threading.Lock()


@dataclass(frozen=True)
class _NpyHeader:
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype
    offset: int  # where the payload starts
    nbytes: int  # payload size, computed with Python integers (never overflows)

    @property
    def end(self) -> int:
        return self.offset + self.nbytes


def npy_header(path: str, data: bytes, size: float) -> _NpyHeader:
    """The header at the start of ``data``, checked against a file of ``size`` bytes."""
    if not data.startswith(_NPY_MAGIC):
        what = "an .npz archive" if data.startswith(_ZIP_MAGIC) else "not a .npy file"
        raise SampleError(path, f"corrupt or truncated .npy: {what} (no NumPy header)")
    fp = io.BytesIO(data)
    try:
        version = npformat.read_magic(fp)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise SampleError(path, f"corrupt or truncated .npy: unknown format version {version}")
        # 3.0 differs from 2.0 only in its header's encoding (UTF-8 for non-ASCII field names
        # of structured dtypes, which are refused anyway).
        read = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
        with _HEADER_PARSE:
            shape, fortran, dtype = read(fp)
    except (ValueError, SyntaxError) as exc:
        raise SampleError(path, f"corrupt or truncated .npy: {exc}") from exc
    problem = dtype_problem(dtype)
    if problem:
        raise SampleError(path, problem)
    if any(d < 0 for d in shape):
        raise SampleError(path, f"corrupt .npy: header shape {shape} has a negative dimension")
    header = _NpyHeader(shape, fortran, dtype, fp.tell(), math.prod(shape) * dtype.itemsize)
    if header.end > size:
        raise SampleError(path, f"corrupt or truncated .npy: header promises {header.nbytes} bytes of {dtype} "
                                f"{shape}, file holds {max(0, size - header.offset)}")
    return header


def _npy_array(path: str, buf: bytes, start: int, header: _NpyHeader) -> np.ndarray:
    """The payload at ``buf[start:]`` viewed in place as the header's array (no copy)."""
    if len(buf) - start < header.nbytes:
        raise SampleError(path, f"corrupt or truncated .npy: header promises {header.nbytes} bytes, "
                                f"read {len(buf) - start} (file shrank while read)")
    try:
        arr = np.frombuffer(buf, dtype=header.dtype, count=math.prod(header.shape), offset=start)
        arr = arr.reshape(header.shape[::-1]).T if header.fortran else arr.reshape(header.shape)
    except ValueError as exc:  # e.g. a zero-size array with a dimension numpy cannot index
        raise SampleError(path, f"corrupt .npy: header shape {header.shape}: {exc}") from exc
    return _native_c(arr)


def decode_npy(path: str, data: bytes) -> dict[str, np.ndarray]:
    """Parse the .npy header and view the payload in place (no copy of the tensor bytes)."""
    header = npy_header(path, data, len(data))
    return {VOLUME_FIELD: _npy_array(path, data, header.offset, header)}


def read_npy(fs: fsspec.AbstractFileSystem, src: SourceFile) -> tuple[dict[str, np.ndarray], int]:
    """A .npy file's array and the bytes read: the header first, then no more than it promises."""
    first = src.size if 0 < src.size <= NPY_ONE_READ else NPY_HEADER_READ
    head = read_bytes(fs, src, 0, first)
    # A remote listing may not know the size (0): then only the header bounds the read.
    size = src.size or (len(head) if len(head) < first else math.inf)
    header = npy_header(src.path, head, size)
    if header.end <= len(head):
        return {VOLUME_FIELD: _npy_array(src.path, head, header.offset, header)}, len(head)
    payload = read_bytes(fs, src, header.offset, header.end)
    return {VOLUME_FIELD: _npy_array(src.path, payload, 0, header)}, len(head) + len(payload)


def _npz_member(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    if not info.filename.endswith(".npy"):
        raise SampleError(path, f".npz member {info.filename!r} is not a .npy array")
    try:
        return decode_npy(path, zf.read(info))[VOLUME_FIELD]
    except SampleError as err:
        raise SampleError(path, f".npz member {info.filename!r}: {err.reason}") from err


def decode_npz(path: str, data: bytes) -> dict[str, np.ndarray]:
    """Every ``.npy`` member of the archive, each checked as a ``.npy`` file is."""
    if not data.startswith(_ZIP_MAGIC):
        what = "a .npy array" if data.startswith(_NPY_MAGIC) else "not a zip archive"
        raise SampleError(path, f"corrupt or truncated .npz: {what}")
    out: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                name = info.filename.removesuffix(".npy")
                if name in out:
                    raise SampleError(path, f".npz holds two members named {info.filename!r}")
                out[name] = _npz_member(path, zf, info)
    except SampleError:
        raise
    except (OSError, EOFError, RuntimeError, NotImplementedError, zipfile.BadZipFile, zlib.error) as exc:
        raise SampleError(path, f"corrupt or truncated .npz: {exc}") from exc
    if not out:
        raise SampleError(path, ".npz archive holds no arrays")
    clash = [n for n in out if n in RESERVED]
    if clash:
        raise SampleError(path, f".npz array name {clash[0]!r} is reserved for the store's own column")
    return out


# ---------------------------------------------------------------- images

#: Pillow modes of 16-bit grayscale images ("I": 32-bit integers, how older Pillow opens them).
_GRAY16 = ("I;16", "I;16B", "I;16L", "I")


def png_bit_depth(data: bytes) -> int | None:
    """Bits per channel from a PNG's header; None for other formats."""
    if data.startswith(_PNG_MAGIC) and data[12:16] == b"IHDR" and len(data) > 24:
        return data[24]
    return None


def encoded_dtype(data: bytes) -> str:
    """The dtype encoded image bytes decode to, at their own bit depth."""
    return "uint16" if png_bit_depth(data) == 16 else "uint8"


def _in_mode(path: str, img: Image.Image, data: bytes, mode: str, reduce_depth: bool = False) -> Image.Image:
    """``img`` in ``mode`` (RGB or L) at its own bit depth; refuses what would lose bits, unless
    ``reduce_depth`` (then 8 bits per channel, scaled: see ``_scaled_to_8_bits``)."""
    if img.mode in _GRAY16:
        if mode == "L":
            return img
        if not reduce_depth:
            raise SampleError(path, f"16-bit grayscale image: --image-mode {mode} would cut it to 8 bits; "
                                    "use --image-mode L to keep its 16-bit pixels, or --reduce-depth to take "
                                    "it at 8 bits")
        img = Image.fromarray(_scaled_to_8_bits(np.asarray(img)), "L")
    elif png_bit_depth(data) == 16 and not reduce_depth:
        raise SampleError(path, "16-bit colour PNG: Pillow decodes it to 8 bits per channel; keep its exact "
                                "bytes with --image-storage encoded and no --resize, or take it at 8 bits "
                                "per channel with --reduce-depth")
    return img if img.mode == mode else img.convert(mode)


def _scaled_to_8_bits(pixels: np.ndarray) -> np.ndarray:
    """16-bit pixels at 8 bits, scaled by the image's own maximum (rounded): a 12-bit CT slice
    (values up to 4095) keeps 256 grey levels, where its high byte would keep 16."""
    top = int(pixels.max()) if pixels.size else 0
    if top == 0:
        return np.zeros(pixels.shape, np.uint8)
    return np.rint(pixels.astype(np.float64) * (255 / top)).astype(np.uint8)


def _promoted(img: Image.Image) -> Image.Image:
    """An 8-bit greyscale image as 16-bit (each value x 257: 0 -> 0, 255 -> 65535; value // 257 gives it back)."""
    return Image.fromarray(np.asarray(img).astype(np.uint16) * np.uint16(257))


def _pixel_array(img: Image.Image) -> np.ndarray:
    arr = np.asarray(img)
    return _native_c(arr.astype(np.uint16) if img.mode == "I" else arr)


def _undecodable(path: str, exc: Exception) -> SampleError:
    return SampleError(path, f"undecodable image: {exc}")


_IMAGE_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def exact_pixels(path: str, data: bytes, mode: str, reduce_depth: bool = False, promote_depth: bool = False
                 ) -> np.ndarray:
    """The image's pixels in ``mode``, exactly as in the file: no resize, own bit depth (8 bits
    with ``reduce_depth``, 16 with ``promote_depth``, as a conversion with them stores them)."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.load()
            pixels = _pixel_array(_in_mode(path, img, data, mode, reduce_depth))
            return pixels.astype(np.uint16) * np.uint16(257) if promote_depth and pixels.dtype == np.uint8 else pixels
    except _IMAGE_ERRORS as exc:
        raise _undecodable(path, exc) from exc


def decode_image(path: str, data: bytes, opts: ImageOptions) -> tuple[dict[str, np.ndarray | bytes], bool]:
    """Decode fully (so corrupt files are caught), then keep bytes or pixels per ``opts``; and
    whether the image was taken at another bit depth than its own."""
    try:
        with Image.open(io.BytesIO(data)) as opened:
            fmt = opened.format
            opened.load()
            deep = opened.mode in _GRAY16 or png_bit_depth(data) == 16
            promote = opts.promote_depth and opts.mode == "L" and not deep
            if opts.storage == "encoded" and opts.resize is None and not promote:
                return {IMAGE_FIELD: data}, False  # its exact bytes, at its own depth
            img = _in_mode(path, opened, data, opts.mode, opts.reduce_depth)
            if promote:
                img = _promoted(img)
            changed = deep != (img.mode in _GRAY16)
            if opts.resize is not None:
                h, w = opts.resize
                img = img.resize((w, h), Image.Resampling.BILINEAR)
            if opts.storage == "decoded":
                return {IMAGE_FIELD: _pixel_array(img)}, changed
            buf = io.BytesIO()
            if fmt == "PNG" or img.mode in _GRAY16:  # 16 bits: PNG holds them, JPEG does not
                img.save(buf, format="PNG")
            else:
                img.save(buf, format="JPEG", quality=95)
            return {IMAGE_FIELD: buf.getvalue()}, changed
    except _IMAGE_ERRORS as exc:
        raise _undecodable(path, exc) from exc


def read_sample(fs: fsspec.AbstractFileSystem, kind: str, src: SourceFile,
                image_opts: ImageOptions) -> tuple[Mapping[str, np.ndarray | bytes], int, bool]:
    """A source file's fields, the bytes read for them and whether an image was taken at
    another bit depth."""
    if kind == NPY:
        return (*read_npy(fs, src), False)
    data = read_bytes(fs, src)
    if kind == NPZ:
        return decode_npz(src.path, data), len(data), False
    fields, changed = decode_image(src.path, data, image_opts)
    return fields, len(data), changed


def field_encoding(kind: str, image_opts: ImageOptions) -> str:
    return IMAGE_BYTES if kind == IMAGE and image_opts.storage == "encoded" else RAW
