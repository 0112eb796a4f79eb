"""The input pipeline of ``train --data-service ADDRESS`` (both frameworks): read, decode,
resize and augment run on the workers of a tf.data service (TensorFlow's own distributed input
engine), not in the training process.

The trainer is the service's client whatever ``--framework``: ``iter_batches`` yields the
workers' batches as numpy arrays (``as_numpy_iterator``), (n, H, W, C) uint8 like every
reader's, so both loops take them unchanged (PyTorch's ``to_inputs`` wraps them with
``torch.from_numpy``; its model moves channels first itself). Hence TensorFlow must be
installed beside PyTorch for ``--framework torch --data-service``.

A service worker is another process, possibly on another machine: it runs the dataset's graph,
never trainfeed's Python code (a ``from_generator`` or ``py_function`` pipeline cannot be
shipped to it). So this pipeline is TF ops end to end: the files of an image folder (blob
layout) are listed here, and the workers read them (``tf.io.read_file``, a path every worker
must see), decode them (``tf.io.decode_jpeg`` with the accurate DCT, or ``decode_png``) and crop / resize / flip
them with ``tf.image``. Compacted stores (Parquet, Delta, HDF5) have no TF-native reader in
tensorflow-cpu, so they are refused.

Pixels: at the stored size, not augmented, they are Pillow's exactly (libjpeg's accurate DCT,
PNG lossless). Resized, they differ: TF decodes at full size and resizes with antialiased
bilinear, Pillow decodes at a reduced DCT scale then resizes; same shape, dtype and labels. The crop
and flip are drawn by stateless TF ops from (seed, epoch, sample id), the same rule as
training/reading/images.py but TF's random numbers, so a sample's augmentation does not depend on
which worker runs it. Order: the file list is permuted by (seed, epoch) here; in
"distributed_epoch" mode the dispatcher hands contiguous splits of it to whichever worker asks,
so every sample is delivered exactly once per epoch but batch composition is not reproducible.
"""
from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.training.reading.images import CROP_AREA, CROP_RATIO
from trainfeed.training.reading.store import Batch, EpochOptions, OpenedStore
from trainfeed.training.tensorflow_env import import_tensorflow

PROCESSING_MODE = "distributed_epoch"  # every element of the source once per epoch, across all workers
CONNECT_TIMEOUT_S = 5.0


def require_tensorflow() -> None:
    """The trainer is the service's client, whatever --framework: a usage error without TensorFlow."""
    try:
        import_tensorflow()
    except ImportError as exc:
        raise UsageError(f"--data-service needs TensorFlow in the training process, also with --framework torch: "
                         f"it receives the batches as a tf.data service client ({exc}); pip install "
                         "'trainfeed[tf]' (tensorflow-cpu)") from None


def dispatcher_host_port(address: str, option: str = "--data-service") -> tuple[str, int]:
    """(host, port) of ``grpc://host:port``; a usage error for anything else."""
    parts = urlsplit(address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "grpc" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise UsageError(f"{option} must be grpc://HOST:PORT (a tf.data service dispatcher), not {address!r}")
    return parts.hostname, port


def check_reachable(address: str) -> None:
    """The dispatcher accepts connections; TensorFlow's client would otherwise retry without end."""
    host, port = dispatcher_host_port(address)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise TrainfeedError(f"--data-service {address}: cannot reach the tf.data service dispatcher "
                             f"({exc.strerror or exc}); start one with `python -m trainfeed.training.data_service "
                             f"dispatcher --port {port}` and its workers") from None


def check_store(store: OpenedStore) -> None:
    """The offloaded pipeline reads local image folders of 8-bit JPEG/PNG files."""
    if not store.format.in_place or store.images is None:
        raise UsageError(f"--data-service: {store.path} is a {store.fmt} store of "
                         f"{'encoded images' if store.images else 'arrays'}; the service's workers run TensorFlow "
                         "ops only and TensorFlow has no reader for it: train from the image folder (JPEG/PNG "
                         "files), or without --data-service")
    if not store.local:
        raise UsageError(f"--data-service: {store.path} is on object storage; the service's workers read local "
                         "(or shared-filesystem) paths")
    if store.images.dtype != "uint8":
        raise UsageError(f"--data-service: {store.path} holds {store.images.dtype} images; the service decodes "
                         "8-bit images only")


def source(store: OpenedStore, opts: EpochOptions, epoch: int) -> tuple[list[str], np.ndarray, list[str]]:
    """(paths, labels, ids) of one epoch, permuted by (seed, epoch) when shuffling."""
    (y,) = store.piece_reader.read_labels(store.listing)  # the small files: one column, in piece order
    files = list(store.pieces)
    if opts.shuffle:
        order = np.random.default_rng((opts.seed, epoch)).permutation(len(files))
        files, y = [files[i] for i in order], y[order]
    return [f.path for f in files], y, [f.id for f in files]


def dataset(store: OpenedStore, opts: EpochOptions, epoch: int) -> Any:
    """One epoch as a ``tf.data.Dataset`` of (x, y, id) samples, built from TF ops only."""
    import tensorflow as tf

    paths, y, ids = source(store, opts, epoch)
    decoding = store.images
    assert decoding is not None, "check_store() lets only image stores through"
    height, width = decoding.size
    augment = opts.augment

    def load(path: Any, label: Any, sample_id: Any) -> Any:
        data = tf.io.read_file(path)
        img = tf.cond(tf.io.is_jpeg(data),  # libjpeg's accurate integer DCT, as Pillow decodes
                      lambda: tf.io.decode_jpeg(data, channels=decoding.channels, dct_method="INTEGER_ACCURATE"),
                      lambda: tf.io.decode_png(data, channels=decoding.channels, dtype=tf.uint8))
        if augment:
            seed = tf.stack([tf.strings.to_hash_bucket_fast(sample_id, 2**62), opts.seed * 2**20 + epoch])
            begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
                tf.shape(img), tf.zeros((1, 0, 4)), seed=seed, min_object_covered=0.0,
                aspect_ratio_range=CROP_RATIO, area_range=CROP_AREA, use_image_if_no_bounding_boxes=True)
            img = tf.slice(img, begin, size)
        out = tf.image.resize(img, (height, width), method="bilinear", antialias=True)
        out = tf.cast(tf.clip_by_value(tf.round(out), 0, 255), tf.uint8)
        if augment:
            out = tf.image.stateless_random_flip_left_right(out, seed=seed + tf.constant([0, 1], tf.int64))
        return tf.ensure_shape(out, (height, width, decoding.channels)), label, sample_id

    return tf.data.Dataset.from_tensor_slices((paths, y, ids)).map(load, num_parallel_calls=tf.data.AUTOTUNE)


def distributed(store: OpenedStore, opts: EpochOptions, epoch: int, address: str | None,
                worker_batch: int = 32) -> Any:
    """The epoch's samples, processed by the service at ``address`` (None: in this process),
    in batches of ``worker_batch`` as they come from the workers."""
    import tensorflow as tf

    ds = dataset(store, opts, epoch).batch(worker_batch)
    if address is None:
        return ds.prefetch(tf.data.AUTOTUNE)
    return ds.apply(tf.data.experimental.service.distribute(processing_mode=PROCESSING_MODE, service=address))


def iter_batches(store: OpenedStore, opts: EpochOptions, epoch: int, address: str) -> Iterator[Batch]:
    """One epoch of training batches of ``opts.batch_size`` from the service's workers, as numpy
    arrays for either framework. Writable, as every reader's: ``as_numpy_iterator`` may hand
    read-only views of TF's tensors, which ``torch.from_numpy`` warns about (a copy if so)."""
    ds = distributed(store, opts, epoch, address).unbatch().batch(opts.batch_size, drop_remainder=opts.drop_last)
    for x, y, ids in ds.prefetch(2).as_numpy_iterator():
        yield Batch(np.require(x, requirements="W"), np.require(y, requirements="W"), [i.decode() for i in ids])
