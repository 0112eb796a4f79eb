"""One dtype for every sample of a field: which dtype holds two others exactly, and a cast
that keeps every value or names the file that has one it would change."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trainfeed.converters.errors import SampleError, UsageError
from trainfeed.converters.layout import SUPPORTED_DTYPES

#: ``--dtype auto``: the dtype is found by reading every .npy file's header first (samples.py).
AUTO = "auto"
#: What ``--dtype`` (convert, the Spark repack) and ``--cast`` (reading a folder) take.
DTYPE_CHOICES = (AUTO, *SUPPORTED_DTYPES)


def check_dtype_option(value: str | None, flag: str) -> None:
    """A usage error unless ``value`` is None, auto or a supported dtype."""
    if value is not None and value not in DTYPE_CHOICES:
        raise UsageError(f"{flag} must be auto or one of {', '.join(SUPPORTED_DTYPES)}, not {value!r}")


def cast_fields(path: str, fields: Mapping[str, np.ndarray | bytes], dtype: str) -> dict[str, np.ndarray | bytes]:
    """A sample's arrays as ``dtype`` (``lossless_cast`` each); encoded image bytes as they are."""
    return {name: lossless_cast(path, name, v, dtype) if isinstance(v, np.ndarray) else v for name, v in fields.items()}


def lossless_cast(path: str, name: str, arr: np.ndarray, dtype: str) -> np.ndarray:
    """``arr`` as ``dtype`` when every value survives the cast exactly; SampleError naming the
    file otherwise (an int32 array holding -5 does not fit uint16; 0.5 does not fit int8)."""
    target = np.dtype(dtype)
    if arr.dtype == target:
        return arr
    out = arr.astype(target)
    if exact_cast(arr.dtype, target):
        return out
    with np.errstate(invalid="ignore", over="ignore"):
        back = out.astype(arr.dtype)
    lost = ~((back == arr) | (np.isnan(arr) & np.isnan(back)) if arr.dtype.kind == "f" else back == arr)
    if target.kind in "iu" and arr.dtype.kind in "iu":  # int16 -5 -> uint16 wraps to 65531 and back to -5
        info = np.iinfo(target)
        lost |= (arr < info.min) | (arr > info.max)
    if lost.any():
        value = arr.reshape(-1)[int(np.flatnonzero(lost.reshape(-1))[0])].item()
        raise SampleError(path, f"{name!r}: {arr.dtype} value {value!r} does not fit --dtype {dtype} exactly; "
                                "choose a dtype that holds every value")
    return out


_MANTISSA_BITS = {2: 11, 4: 24, 8: 53}


def exact_cast(src: np.dtype, dst: np.dtype) -> bool:
    """Whether every value of ``src`` is a value of ``dst`` (numpy's "safe" calls int64 ->
    float64 safe; it is not exact beyond 2**53)."""
    if src.kind in "iu" and dst.kind == "f":
        return src.itemsize * 8 - (src.kind == "i") <= _MANTISSA_BITS[dst.itemsize]
    return bool(np.can_cast(src, dst, "safe"))


def holding_both(a: str, b: str) -> str | None:
    """The smallest dtype that holds every value of ``a`` and of ``b`` exactly; None when none
    does (uint64 beside a signed integer, 64-bit integers beside floats)."""
    both = np.promote_types(a, b)
    exact = exact_cast(np.dtype(a), both) and exact_cast(np.dtype(b), both)
    return both.name if exact and both.name in SUPPORTED_DTYPES else None
