"""CPU cost of each stage of an image input pipeline, per sample: read (the store's pieces, as
the reader reads them), decode+resize (encoded images to the training size; nothing for a store
of decoded pixels) and augment (random resized crop and horizontal flip of the decoded pixels,
seeded as in training). Measured with the calling thread's CPU time over the first pieces of
the store, one stage after the other, so waiting on storage (latency, emulated or real) counts
in no stage: what is left between these figures and the reader's rate is I/O wait."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from PIL import Image

from trainfeed.converters.errors import TrainfeedError
from trainfeed.converters.formats.interface import OpenFiles
from trainfeed.training.reading import images
from trainfeed.training.reading.store import OpenedStore

#: Samples the stages are measured over (whole pieces: at least this many).
SAMPLES = 64


@dataclass(frozen=True, slots=True)
class StageCosts:
    """CPU seconds per sample of each stage (``read``, ``decode``, ``augment``: model.measured.STAGES)
    over ``samples`` samples, and the bytes of a sample as stored and as decoded pixels; a cell
    records it as its ``stages`` (``asdict``)."""

    read: float
    decode: float
    augment: float
    samples: int
    stored_bytes_per_sample: float
    pixel_bytes_per_sample: int


def stage_costs(store: OpenedStore, samples: int = SAMPLES, seed: int = 0) -> StageCosts:
    """The CPU cost of each stage over the first pieces of ``store`` holding ``samples`` samples."""
    listing, reader = store.listing, store.piece_reader
    pieces, n, read_s = [], 0, 0.0
    for piece in store.pieces:
        t0 = time.thread_time()
        cols = reader.read_piece(listing, piece, OpenFiles())
        read_s += time.thread_time() - t0
        pieces.append((reader.piece_file(piece), cols))
        n += len(cols.ids)
        if n >= samples:
            break
    if not n:
        raise TrainfeedError(f"{store.path}: the store holds no samples")
    stored = sum(_nbytes(x) for _, cols in pieces for x in cols.x)
    augment = images.Augment(seed, 0)
    decoded, decode_s = [cols for _, cols in pieces], 0.0  # decoded pixels: nothing to decode
    if store.images is not None:
        where, first = pieces[0]
        images.decode_piece(first, store.images, where, None)  # warm-up: first calls pay for lazy set-up
        t0 = time.thread_time()
        decoded = [images.decode_piece(cols, store.images, where, None) for where, cols in pieces]
        decode_s = time.thread_time() - t0
    augmented(decoded[0].x[0], decoded[0].ids[0], augment)  # warm-up
    t0 = time.thread_time()
    for cols in decoded:
        for sample_id, pixels in zip(cols.ids, cols.x):
            augmented(pixels, sample_id, augment)
    augment_s = time.thread_time() - t0
    pixels = decoded[0].x[0]
    return StageCosts(read=read_s / n, decode=decode_s / n, augment=augment_s / n, samples=n,
                      stored_bytes_per_sample=stored / n, pixel_bytes_per_sample=int(np.asarray(pixels).nbytes))


def augmented(pixels: np.ndarray, sample_id: str, augment: images.Augment) -> np.ndarray:
    """``pixels`` (H, W, C), or (H, W) as a store of greyscale pixels holds them, with the random
    resized crop and flip training draws for ``sample_id``, at the same size."""
    height, width = pixels.shape[:2]
    box, flip = augment.draw(sample_id, width, height)
    img = Image.fromarray(pixels[..., 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels)
    out = np.asarray(img.resize((width, height), Image.Resampling.BILINEAR, box=box)).reshape(pixels.shape)
    return out[:, ::-1] if flip else out


def _nbytes(value: object) -> int:
    return len(value) if isinstance(value, (bytes, bytearray, memoryview)) else int(np.asarray(value).nbytes)
