"""Decoding images at training time: what one core decodes, and what the reader delivers.

1. ``decode``: JPEG decode + resize to the model's input + augmentation (random resized crop,
   flip), one thread, per decoder: ``pillow`` is the reader's own path (``training/reading/images.py``:
   Pillow's reduced-scale decode, ``Image.draft``: scales 1, 1/2, 1/4, 1/8), ``pillow-full``
   decodes at full size before resizing; ``simplejpeg`` (libjpeg-turbo through simplejpeg, when
   installed) decodes at the same scale as ``pillow`` (``simplejpeg-same-scale``: the same
   pixels) or at the smallest of libjpeg-turbo's 1/8-step scales that is large enough
   (``simplejpeg``: other pixels); ``tf`` is ``tf.io.decode_jpeg`` with ``ratio`` and
   ``tf.image.resize`` (with ``--tf``). Every decoder gets the same crop boxes; all but the
   reader's own resize with Pillow.
2. ``input``: one epoch of training input (the read engine, augmentation on, no model) from
   the JPEG folder (``blob``), an encoded Parquet store (the JPEG bytes; row groups of 4 MB,
   ~100 images, so that 2,000 images make enough pieces for the threads to share) and a
   decoded Parquet store (pixels at the output size, decoded once at conversion), with N
   reader threads, next to N x the single-thread ``pillow`` rate (``vs_decode``; the target is
   >= 0.8) and to what N threads of GIL-free work (SHA-256 of 8 MB buffers) got out of the
   machine just before (``ceiling``: N on an idle machine with N free cores).

A generated set (default 2,000 JPEGs of 360x480: gradients, shapes and sensor-like noise, about
40 KB each at quality 90) in class folders. Page cache warm (the files were just written).
Wall-clock rates and CPU seconds are both reported: on a shared machine the CPU figures move
less. JSON lines on stdout.

    python -m trainfeed.benchmarks.micro.decode_bench [--count 2000] [--size 360x480] [--out-size 64x64] [--workers 1,2]
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from trainfeed.converters.convert import ConvertConfig, convert
from trainfeed.converters.formats.options import OpenOptions, WriteOptions
from trainfeed.converters.sources.decode import ImageOptions, parse_resize
from trainfeed.training.metrics import environment
from trainfeed.training.reading import images
from trainfeed.training.reading.readers import iter_batches, open_store
from trainfeed.training.reading.store import EpochOptions
from trainfeed.training.tensorflow_env import import_tensorflow


def photo(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """A photo-like image: a colour gradient, a dozen filled shapes, mild noise."""
    h, w = size
    base = np.linspace(0, 1, w)[None, :, None] * rng.uniform(60, 200, 3) + \
        np.linspace(0, 1, h)[:, None, None] * rng.uniform(0, 60, 3)
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        box = (x0, y0, x0 + int(rng.integers(10, w // 2)), y0 + int(rng.integers(10, h // 2)))
        fill = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    noisy = np.asarray(img, np.float32) + rng.normal(0, 6, (h, w, 3)).astype(np.float32)
    return np.clip(noisy, 0, 255).astype(np.uint8)


def generate(out: Path, count: int, size: tuple[int, int], seed: int = 0) -> int:
    """``count`` JPEGs in OUT/class_0, OUT/class_1; their total bytes."""
    rng = np.random.default_rng(seed)
    total = 0
    for i in range(count):
        path = out / f"class_{i % 2}" / f"img_{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(photo(rng, size)).save(buf, format="JPEG", quality=90)
        path.write_bytes(buf.getvalue())
        total += buf.tell()
    return total


# ---------------------------------------------------------------- decoders (one image: bytes -> (H, W, 3))

#: A crop box (left, top, right, bottom) in the image's pixels, as ``images.Augment.draw`` gives it.
Box = tuple[float, float, float, float]
Decoder = Callable[[bytes, str, Box, bool], np.ndarray]


def reader_path(decoding: images.Decoding, augment: images.Augment) -> Decoder:
    """The reader's own decode (the box is drawn again inside, as the reader does)."""
    return lambda data, sample_id, box, flip: images.decode(data, decoding, sample_id, sample_id, augment)


def _finish(img: Image.Image, box: Box, scale: tuple[float, float], size: tuple[int, int], flip: bool) -> np.ndarray:
    fx, fy = scale
    out = np.asarray(img.resize((size[1], size[0]), Image.Resampling.BILINEAR,
                                box=(box[0] * fx, box[1] * fy, box[2] * fx, box[3] * fy)))
    return out[:, ::-1] if flip else out


def pillow_full(size: tuple[int, int]) -> Decoder:
    def decode(data: bytes, sample_id: str, box: Box, flip: bool) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as img:
            return _finish(img.convert("RGB"), box, (1.0, 1.0), size, flip)
    return decode


def _request(box: Box, full: tuple[int, int], size: tuple[int, int]) -> tuple[int, int]:
    """(height, width) the decode must keep for ``box`` to hold ``size`` pixels (as images.py asks draft)."""
    return (math.ceil(size[0] * full[0] / (box[3] - box[1])), math.ceil(size[1] * full[1] / (box[2] - box[0])))


def _pillow_scale(request: tuple[int, int], full: tuple[int, int]) -> int:
    """The DCT scale divisor ``Image.draft`` picks (8, 4, 2 or 1)."""
    ratio = min(full[0] // request[0], full[1] // request[1])
    return next((s for s in (8, 4, 2) if ratio >= s), 1)


def simplejpeg_decoder(size: tuple[int, int], full: tuple[int, int], same_scale: bool) -> Decoder:
    import simplejpeg

    def decode(data: bytes, sample_id: str, box: Box, flip: bool) -> np.ndarray:
        h, w = _request(box, full, size)
        if same_scale:  # at least the image's size at Pillow's scale gets exactly that scale
            scale = _pillow_scale((h, w), full)
            h, w = -(-full[0] // scale), -(-full[1] // scale)
        arr = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=h, min_width=w)
        return _finish(Image.fromarray(arr), box, (arr.shape[1] / full[1], arr.shape[0] / full[0]), size, flip)
    return decode


def tf_decoder(size: tuple[int, int], full: tuple[int, int]) -> Decoder:
    tf = import_tensorflow()

    def decode(data: bytes, sample_id: str, box: Box, flip: bool) -> np.ndarray:
        arr = tf.io.decode_jpeg(data, channels=3, ratio=_pillow_scale(_request(box, full, size), full))
        f = arr.shape[0] / full[0]
        top, left = int(box[1] * f), int(box[0] * f)
        crop = arr[top:max(top + 1, int(box[3] * f)), left:max(left + 1, int(box[2] * f))]
        out: np.ndarray = tf.cast(tf.image.resize(crop, size, antialias=True), tf.uint8).numpy()
        return out[:, ::-1] if flip else out
    return decode


def time_decoder(decode: Decoder, samples: list[tuple[str, bytes, Box, bool]]) -> dict[str, Any]:
    decode(samples[0][1], samples[0][0], samples[0][2], samples[0][3])  # warm up (imports, first allocation)
    t0, c0 = time.perf_counter(), time.thread_time()
    for sample_id, data, box, flip in samples:
        decode(data, sample_id, box, flip)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return {"samples": len(samples), "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "samples_per_s": round(len(samples) / wall, 1), "samples_per_cpu_s": round(len(samples) / cpu, 1)}


def ceiling(threads: int, seconds: float = 1.0) -> float:
    """How many cores ``threads`` threads of GIL-free work get now: their throughput over one
    thread's (SHA-256 releases the GIL for large buffers), each measured for ~``seconds``."""
    buf = bytes(8 << 20)

    def hashes(deadline: float) -> int:
        n = 0
        while time.perf_counter() < deadline:
            hashlib.sha256(buf).digest()
            n += 1
        return n

    rates = []
    for n in (1, threads):
        with ThreadPoolExecutor(n) as pool:
            t0 = time.perf_counter()
            done = sum(pool.map(hashes, [t0 + seconds] * n))
            rates.append(done / (time.perf_counter() - t0))
    return round(rates[1] / rates[0], 2)


def input_epoch(path: Path, fmt: str | None, workers: int, image_size: tuple[int, int] | None) -> dict[str, Any]:
    """One augmented epoch of batches of 64 from the read engine; no model."""
    opts = EpochOptions(batch_size=64, workers=workers, seed=0, augment=True, drop_last=False)
    store = open_store(str(path), fmt, OpenOptions(image_size=image_size))
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(batch.ids) for batch in iter_batches(store, opts))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    shape = store.sample_spec.shape
    assert shape is not None, "decoded to one size (--image-size or a decoded store), every sample has one shape"
    return {"samples": n, "seconds": round(wall, 3), "cpu_seconds": round(cpu, 3),
            "samples_per_s": round(n / wall, 1), "samples_per_cpu_s": round(n / cpu, 1),
            "sample_shape": list(shape)}


def run(args: argparse.Namespace, work: Path) -> None:
    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    size, out_size = parse_resize(args.size), parse_resize(args.out_size, "--out-size")
    assert size is not None and out_size is not None, "--size and --out-size have defaults"
    src = work / "jpegs"
    t0 = time.perf_counter()
    nbytes = generate(src, args.count, size)
    emit({"bench": "dataset", "count": args.count, "size": list(size), "out_size": list(out_size),
          "mean_jpeg_bytes": nbytes // args.count, "generate_s": round(time.perf_counter() - t0, 1),
          "cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2), "environment": environment()})

    files = sorted(src.rglob("*.jpg"))
    augment = images.Augment(seed=0, epoch=0)
    samples: list[tuple[str, bytes, Box, bool]] = []
    for f in files:
        sample_id = f"{f.parent.name}/{f.stem}"
        box, flip = augment.draw(sample_id, size[1], size[0])
        samples.append((sample_id, f.read_bytes(), box, flip))
    decoders: dict[str, Callable[[], Decoder]] = {
        "pillow": lambda: reader_path(images.Decoding(out_size, 3, "uint8", True, "first"), augment),
        "pillow-full": lambda: pillow_full(out_size),
        "simplejpeg-same-scale": lambda: simplejpeg_decoder(out_size, size, same_scale=True),
        "simplejpeg": lambda: simplejpeg_decoder(out_size, size, same_scale=False)}
    if args.tf:
        decoders["tf"] = lambda: tf_decoder(out_size, size)
    rates = {}
    for name, make in decoders.items():
        try:
            decode = make()
        except ImportError as exc:
            emit({"bench": "decode", "decoder": name, "skipped": f"not installed: {exc}"})
            continue
        result = time_decoder(decode, samples)
        rates[name] = result["samples_per_s"]
        emit({"bench": "decode", "decoder": name, "threads": 1, **result})

    # layout: (path, format, --image-size)
    stores: dict[str, tuple[Path, str, tuple[int, int] | None]] = {"blob": (src, "blob", out_size)}
    for name, image, write in (("encoded", ImageOptions(), WriteOptions(row_group_size=4 * 10**6)),
                               ("decoded", ImageOptions(resize=out_size, storage="decoded"), WriteOptions())):
        dst = work / f"{name}.parquet"
        t0 = time.perf_counter()
        convert(ConvertConfig(src=str(src), dst=str(dst), fmt="parquet", write=write, image=image,
                              workers=max(args.workers)))
        emit({"bench": "convert", "store": name, "seconds": round(time.perf_counter() - t0, 2),
              "bytes": sum(p.stat().st_size for p in dst.rglob("*.parquet"))})
        stores[name] = (dst, "parquet", out_size if name == "encoded" else None)
    for layout, (path, fmt, image_size) in stores.items():
        for workers in args.workers:
            available = ceiling(workers)
            result = input_epoch(path, fmt, workers, image_size)
            record = {"bench": "input", "layout": layout, "workers": workers, "ceiling": available, **result}
            if layout != "decoded":
                record["decode_rate_x_n"] = round(workers * rates["pillow"], 1)
                record["vs_decode"] = round(result["samples_per_s"] / record["decode_rate_x_n"], 2)
            emit(record)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000, help="JPEGs to generate (default 2000)")
    ap.add_argument("--size", default="360x480", help="their HEIGHTxWIDTH (default 360x480)")
    ap.add_argument("--out-size", default="64x64", help="the model's input, HEIGHTxWIDTH (default 64x64)")
    ap.add_argument("--workers", type=lambda s: [int(n) for n in s.split(",")], default=[1, 2],
                    help="reader threads to measure, comma-separated (default 1,2)")
    ap.add_argument("--tf", action="store_true", help="also time TensorFlow's decoder (imports TensorFlow)")
    ap.add_argument("--dir", default=None, help="work folder (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=False)
        run(args, Path(args.dir))
    else:
        with tempfile.TemporaryDirectory(prefix="decode-bench-") as work:
            run(args, Path(work))


if __name__ == "__main__":
    main()
