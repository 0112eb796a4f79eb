"""Samples of different shapes into batches of one: the reader's ``fit``, the user's explicit
choice (a ragged store keeps every sample's own shape; nothing guesses how to batch them).

``pad:SHAPE`` zero-pads each axis at its end (a sample larger than SHAPE is refused: padding
never drops a value); ``crop:SHAPE`` takes the centre of an axis longer than SHAPE's and
zero-pads a shorter one at its end; ``resize:SHAPE`` interpolates linearly along each axis (half-
pixel centres, as ``torch.nn.functional.interpolate(mode="linear", align_corners=False)``;
integers rounded back to their dtype). A sample with fewer axes than SHAPE is taken with leading
axes of 1 (numpy's broadcasting rule: (H, W) into D x H x W); one with more is refused unless its
extra leading axes are 1. Each sample's own shape (with those leading 1s) comes with the batch,
so the padded region is known (``Batch.shapes``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.formats.interface import Columns, Empty
from trainfeed.converters.layout import FieldSpec

HOW = ("pad", "crop", "resize")


@dataclass(frozen=True)
class Fit:
    """How samples become one shape: ``how`` (pad, crop, resize) to ``shape``."""

    how: str
    shape: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Fit:
        """``"pad:32x32"``, ``"crop:16x64x64"``, ``"resize:64x64x1"``."""
        how, _, dims = str(text).partition(":")
        sizes = dims.lower().split("x")
        if how not in HOW or not all(s.isdigit() and int(s) > 0 for s in sizes):
            raise UsageError(f"fit must be pad:SHAPE, crop:SHAPE or resize:SHAPE with SHAPE sizes joined by x "
                             f"(e.g. pad:32x32, resize:16x64x64), not {text!r}")
        return cls(how, tuple(int(s) for s in sizes))

    def __str__(self) -> str:
        return f"{self.how}:{'x'.join(map(str, self.shape))}"

    def spec(self, spec: FieldSpec) -> FieldSpec:
        """The field as fitted batches deliver it."""
        return FieldSpec(spec.name, spec.dtype, self.shape, spec.encoding, spec.channels)


def _aligned(where: str, sample_id: str, arr: np.ndarray, fit: Fit) -> np.ndarray:
    """``arr`` with as many axes as the fit's shape: leading axes of 1 added, or removed."""
    extra = arr.ndim - len(fit.shape)
    if extra > 0:
        if any(d != 1 for d in arr.shape[:extra]):
            raise TrainfeedError(f"{where}: sample {sample_id!r} has shape {arr.shape}, more axes than fit {fit} "
                                 f"takes; give a SHAPE of {arr.ndim} sizes")
        return arr.reshape(arr.shape[extra:])
    return arr.reshape((1,) * -extra + arr.shape)


def _resized_axis(a: np.ndarray, axis: int, size: int) -> np.ndarray:
    n = a.shape[axis]
    if n == size:
        return a
    pos = np.clip((np.arange(size) + 0.5) * (n / size) - 0.5, 0, n - 1)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    w = (pos - lo).reshape([size if k == axis else 1 for k in range(a.ndim)])
    mixed: np.ndarray = np.take(a, lo, axis) * (1 - w) + np.take(a, hi, axis) * w
    return mixed


def _resized(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = arr.astype(np.float64 if arr.dtype.itemsize > 4 or arr.dtype.kind != "f" else np.float32)
    for axis in sorted(range(len(shape)), key=lambda k: shape[k] / out.shape[k]):  # the most shrunk first: less work
        out = _resized_axis(out, axis, shape[axis])
    if arr.dtype.kind in "iub":
        info = np.iinfo(arr.dtype) if arr.dtype.kind != "b" else None
        out = np.rint(out)
        if info is not None:
            out = np.clip(out, info.min, info.max)
    return out.astype(arr.dtype)


def fit_into(where: str, sample_id: str, arr: np.ndarray, fit: Fit, out: np.ndarray) -> tuple[int, ...]:
    """Write ``arr`` fitted into ``out`` (zeroed where padded); the sample's own shape, aligned."""
    arr = _aligned(where, sample_id, np.asarray(arr), fit)
    if arr.shape == fit.shape:  # nothing to fit: one copy
        out[...] = arr
        return arr.shape
    if fit.how == "resize":
        out[...] = _resized(arr, fit.shape)
        return arr.shape
    if fit.how == "pad" and any(n > m for n, m in zip(arr.shape, fit.shape)):
        raise TrainfeedError(f"{where}: sample {sample_id!r} has shape {arr.shape}, larger than fit {fit}: padding "
                             "drops nothing; use a larger pad, or crop:SHAPE or resize:SHAPE")
    src = tuple(slice((n - m) // 2, (n - m) // 2 + m) if n > m else slice(0, n) for n, m in zip(arr.shape, fit.shape))
    dst = tuple(slice(0, min(n, m)) for n, m in zip(arr.shape, fit.shape))
    out[...] = 0
    out[dst] = arr[src]
    return arr.shape


def fit_piece(cols: Columns, fit: Fit, where: str, empty: Empty = np.empty) -> Columns:
    """A piece's samples (an object array of arrays, or one array of fixed-shape samples) as one
    array of the fit's shape, with each sample's own shape (``Columns.shapes``)."""
    n = len(cols.x)
    dtype = cols.x[0].dtype if cols.x.dtype == object and n else cols.x.dtype
    x = empty((n, *fit.shape), dtype)
    shapes = np.ones((n, len(fit.shape)), np.int64)
    if cols.x.dtype != object and cols.x.shape[1:] == fit.shape:  # samples of one shape, the fit's
        x[...] = cols.x
        shapes[:] = fit.shape
        return Columns(cols.ids, cols.labels, x, shapes)
    for i in range(n):
        shapes[i] = fit_into(where, cols.ids[i], cols.x[i], fit, x[i])
    return Columns(cols.ids, cols.labels, x, shapes)
