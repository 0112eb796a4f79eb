"""Encoded images (JPEG/PNG bytes in a store, or the files of an image folder) decoded at
training time into what batches deliver: (n, H, W, C) uint8 arrays, uint16 for 16-bit
greyscale PNGs, C = 1 for greyscale and 3 for colour.

The read engine's worker threads decode a piece right after reading it (Pillow releases the
GIL while it decodes and resizes). A JPEG larger than its output is decoded at a reduced DCT
scale (``Image.draft``: a 360x480 photo decodes straight to 90x120 for a 64x64 input), then
resized with Pillow's bilinear filter; an image already at the output size and not augmented
is decoded exactly as ``convert --image-storage decoded`` stores it. Pillow is the only
decoder, so the pixels do not depend on what else is installed (docs/BENCHMARKS.md compares
simplejpeg and TensorFlow). Training augmentation (random resized crop, horizontal flip) is
drawn from (seed, epoch, sample id) alone, so a batch is the same whatever the worker count,
shard or resume point.
"""
from __future__ import annotations

import hashlib
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
from PIL import Image

from trainfeed.converters.errors import SampleError, TrainfeedError
from trainfeed.converters.formats.interface import Columns, Empty
from trainfeed.converters.layout import RAW, FieldSpec
from trainfeed.converters.sources.decode import _IMAGE_ERRORS, _in_mode, _pixel_array, _undecodable, exact_pixels

#: Random resized crop: a crop covering this fraction of the image's area, at an aspect ratio
#: (width / height) in CROP_RATIO, resized to the output size. Torchvision's lower bound, 0.08,
#: leaves too little of a 64x64 image.
CROP_AREA = (0.25, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)


@dataclass(frozen=True)
class Decoding:
    """How a store's encoded images become arrays: output ``size`` (H, W), ``channels`` (1 or
    3), ``dtype``; ``resize``: images of another size are resized to ``size`` (the store was
    resized at conversion, or ``--image-size`` was given), else they are refused."""

    size: tuple[int, int]
    channels: int
    dtype: str
    resize: bool
    first: str  # the image the size came from, for error messages

    @property
    def mode(self) -> str:
        return "L" if self.channels == 1 else "RGB"

    def spec(self, name: str) -> FieldSpec:
        """The field as batches deliver it."""
        return FieldSpec(name, self.dtype, (*self.size, self.channels), RAW)


def plan(spec: FieldSpec, image_size: tuple[int, int] | None, first: Callable[[], tuple[str, str, bytes]]
         ) -> Decoding:
    """How to decode field ``spec``. Size: ``image_size``, else the store's (resized at
    conversion), else the first image's. Channels: the store's when it was resized at
    conversion (its --image-mode), else the first image's (greyscale stays one channel).
    ``first()``: (file, sample id, bytes) of the store's first image, read only when needed."""
    if spec.shape is not None:
        height, width, channels = spec.shape
        first_name = "the store's size"
    else:
        where, sample_id, data = first()
        first_name = f"the first image, {sample_id!r},"
        with _opened(where, data) as img:
            width, height = img.size
            channels = 1 if Image.getmodebase(img.mode) == "L" else 3
        if spec.dtype == "uint16" and channels != 1:
            raise TrainfeedError(f"{where}: image {sample_id!r} is a 16-bit colour PNG: Pillow decodes it to 8 bits "
                                 "per channel, so it cannot be trained on at its depth")
    fixed = image_size is not None or spec.shape is not None
    size = cast("tuple[int, int]", tuple(image_size or (height, width)))  # (H, W), whether given as a tuple or a list
    return Decoding(size, channels, spec.dtype, fixed, first_name)


@dataclass(frozen=True)
class Augment:
    """Training augmentation for one epoch: random resized crop and horizontal flip, seeded by
    (seed, epoch, sample id)."""

    seed: int
    epoch: int

    def draw(self, sample_id: str, width: int, height: int) -> tuple[tuple[float, float, float, float], bool]:
        """(crop box (left, top, right, bottom) in the image's pixels, flip) for this sample."""
        key = int.from_bytes(hashlib.blake2b(sample_id.encode(), digest_size=8).digest(), "little")
        rng = np.random.default_rng((self.seed, self.epoch, key))
        area = rng.uniform(*CROP_AREA) * width * height
        ratio = math.exp(rng.uniform(math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])))
        w = min(width, math.sqrt(area * ratio))
        h = min(height, math.sqrt(area / ratio))
        left, top = rng.uniform(0, width - w), rng.uniform(0, height - h)
        return (left, top, left + w, top + h), bool(rng.random() < 0.5)


def decode(data: bytes, decoding: Decoding, where: str, sample_id: str, augment: Augment | None = None) -> np.ndarray:
    """One image as an (H, W, C) array of ``decoding``'s size, channels and dtype."""
    with _opened(where, data) as img:
        width, height = img.size
        if not decoding.resize and (height, width) != decoding.size:
            raise TrainfeedError(f"{where}: image {sample_id!r} is {height}x{width} (HxW) but {decoding.first} is "
                                 f"{decoding.size[0]}x{decoding.size[1]}: images differ in size; pass --image-size "
                                 "HxW to resize every image to one size")
        box, flip = augment.draw(sample_id, width, height) if augment else ((0, 0, width, height), False)
        if box == (0, 0, width, height) and (height, width) == decoding.size:
            pixels = exact_pixels(where, data, decoding.mode)
        else:
            pixels = _resized(where, img, data, decoding, box)
    if pixels.dtype != decoding.dtype:
        raise TrainfeedError(f"{where}: image {sample_id!r} decodes to {pixels.dtype} pixels, the store's images to "
                             f"{decoding.dtype}: its images must share one bit depth")
    pixels = pixels.reshape((*decoding.size, decoding.channels))
    return pixels[:, ::-1] if flip else pixels


def _resized(where: str, img: Image.Image, data: bytes, decoding: Decoding,
             box: tuple[float, float, float, float]) -> np.ndarray:
    """``box`` of the image resized to the output size; a JPEG is first decoded at the
    smallest DCT scale that keeps at least the output's resolution inside ``box``."""
    height, width = decoding.size
    full = img.size
    request = (math.ceil(width * full[0] / (box[2] - box[0])), math.ceil(height * full[1] / (box[3] - box[1])))
    img.draft(img.mode, request)  # no-op unless JPEG
    fx, fy = img.size[0] / full[0], img.size[1] / full[1]
    try:
        img.load()
        scaled = _in_mode(where, img, data, decoding.mode)
        out = scaled.resize((width, height), Image.Resampling.BILINEAR,
                            box=(box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy))
    except _IMAGE_ERRORS as exc:
        raise _undecodable(where, exc) from exc
    return _pixel_array(out)


def _opened(where: str, data: bytes) -> Image.Image:
    try:
        return Image.open(io.BytesIO(data))
    except _IMAGE_ERRORS as exc:
        raise _undecodable(where, exc) from exc


def decode_piece(cols: Columns, decoding: Decoding, where: str, augment: Augment | None,
                 empty: Empty = np.empty) -> Columns:
    """A piece read with its encoded images (``cols.x``: one buffer per row) -> the same rows
    with decoded images, in memory from ``empty``."""
    x = empty((len(cols.ids), *decoding.size, decoding.channels), np.dtype(decoding.dtype))
    for i, (sample_id, data) in enumerate(zip(cols.ids, cols.x)):
        try:
            x[i] = decode(bytes(data), decoding, where, sample_id, augment)
        except SampleError as err:
            raise TrainfeedError(f"{where}: image {sample_id!r}: {err.reason}") from err
    return Columns(cols.ids, cols.labels, x)
