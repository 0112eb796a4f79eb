"""Synthetic, learnable datasets shaped like the reference cases.

Volumes: one ``.npy`` per sample, float32, default 30x30x10 voxels x 10 channels (the
whitepaper's 360 KB volumes), or of any sample shape train takes: (X, Y, Z, C) volumes, (H, W, C)
and (H, W) images. The binary label is a known function of the data: 1 when the mean of
channel 0 over the corner region ``[:8, :8]`` of the first two axes is positive. Each sample
is noise plus a shift of that region by +-``signal``, so a small model learns it quickly.

Images: JPEG class folders (default 360x480, the street-photo case), each class with its
own stripe orientation under noise and a random tint.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from types import EllipsisType
from typing import Any

import numpy as np
from PIL import Image

VOLUME_SHAPE = (30, 30, 10, 10)
IMAGE_SIZE = (360, 480)
#: The ranks of the sample shapes train takes: (H, W), (H, W, C) and (X, Y, Z, C).
SAMPLE_RANKS = (2, 3, 4)


def region(rank: int) -> tuple[slice | EllipsisType | int, ...]:
    """The corner region the label is read from: ``[:8, :8]`` of the first two axes, of channel 0
    (the last axis) when the samples have channels (rank 3 or 4)."""
    corner = (slice(0, 8), slice(0, 8))
    return corner if rank == 2 else (*corner, Ellipsis, 0)


def volume_label(volume: np.ndarray) -> int:
    """The label function of the synthetic volumes."""
    return int(volume[region(volume.ndim)].mean() > 0)


def make_volume(rng: np.random.Generator, shape: tuple[int, ...], signal: float = 0.5) -> tuple[np.ndarray, int]:
    vol = rng.standard_normal(shape, dtype=np.float32)
    sign = 1.0 if rng.random() < 0.5 else -1.0
    vol[region(len(shape))] += np.float32(sign * signal)
    return vol, volume_label(vol)


def generate_volumes(out: Path, count: int, *, shape: tuple[int, ...] = VOLUME_SHAPE, seed: int = 0,
                     labels: str = "csv", signal: float = 0.5,
                     progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """``count`` volumes (or images, of a shape of rank 2 or 3) as ``OUT/vol_NNNNNN.npy`` with
    ``OUT/labels.csv`` (labels="csv"), or in class folders ``OUT/neg/`` and ``OUT/pos/``
    (labels="folders")."""
    if len(shape) not in SAMPLE_RANKS or min(shape) < 1:
        raise ValueError(f"sample shape must be (x, y, z, channels), (h, w, channels) or (h, w), got {shape}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=False)
    rng = np.random.default_rng(seed)
    rows = []
    width = max(6, len(str(count - 1)))
    for i in range(count):
        vol, label = make_volume(rng, shape, signal)
        name = f"vol_{i:0{width}d}"
        if labels == "folders":
            sub = out / ("pos" if label else "neg")
            sub.mkdir(exist_ok=True)
            np.save(sub / f"{name}.npy", vol)
        else:
            np.save(out / f"{name}.npy", vol)
            rows.append((name, label))
        if progress:
            progress(i + 1)
    if labels != "folders":
        with open(out / "labels.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["id", "label"])
            writer.writerows(rows)
    nbytes = int(np.prod(shape)) * 4
    return {"kind": "volumes", "path": str(out), "count": count, "shape": list(shape), "sample_bytes": nbytes,
            "labels": "labels.csv" if labels != "folders" else "folders"}


def make_image(rng: np.random.Generator, size: tuple[int, int], cls: int, n_classes: int) -> np.ndarray:
    h, w = size
    angle = np.pi * cls / n_classes
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    period = max(8.0, min(h, w) / 6)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period)
    tint = rng.uniform(0.4, 1.0, size=3).astype(np.float32)
    img = 128 + 80 * stripes[..., None] * tint + rng.normal(0, 25, size=(h, w, 3)).astype(np.float32)
    pixels: np.ndarray = np.clip(img, 0, 255).astype(np.uint8)
    return pixels


def generate_images(out: Path, count: int, *, size: tuple[int, int] = IMAGE_SIZE, classes: int = 2,
                    seed: int = 0, fmt: str = "jpeg", progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """``count`` images in class folders ``OUT/class_K/img_NNNNNN.jpg`` (or .png)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=False)
    rng = np.random.default_rng(seed)
    ext = "png" if fmt == "png" else "jpg"
    width = max(6, len(str(count - 1)))
    total = 0
    for i in range(count):
        cls = int(rng.integers(classes))
        sub = out / f"class_{cls}"
        sub.mkdir(exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(make_image(rng, size, cls, classes)).save(buf, format="PNG" if ext == "png" else "JPEG",
                                                                  quality=90)
        (sub / f"img_{i:0{width}d}.{ext}").write_bytes(buf.getvalue())
        total += buf.tell()
        if progress:
            progress(i + 1)
    return {"kind": "images", "path": str(out), "count": count, "size": list(size), "classes": classes,
            "bytes": total, "labels": "folders"}
