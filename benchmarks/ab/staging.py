"""Staging the stores a matrix compares: every store on the one storage backend, opened as the
cells will read it, with the reader options and connection budget every cell shares."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from trainfeed.benchmarks.ab.config import MatrixConfig, why
from trainfeed.benchmarks.ab.measure import CellReading
from trainfeed.benchmarks.ab.stages import StageCosts, stage_costs
from trainfeed.benchmarks.ab.storage import Backend, StoreSource, stage_small_files, stage_store
from trainfeed.benchmarks.model.measured import STAGES
from trainfeed.converters.errors import UsageError
from trainfeed.converters.formats.options import OpenOptions
from trainfeed.converters.formats.registry import IN_PLACE
from trainfeed.converters.sources.decode import ImageOptions
from trainfeed.training.loops.plan import model_input_shape
from trainfeed.training.reading.readers import open_store
from trainfeed.training.reading.store import EpochOptions, OpenedStore


@dataclass(frozen=True)
class Staged:
    """One store staged on the backend: its URL there, how the cells read it, the shape the
    models take its samples in (``model_shape``) and their bytes, how it holds images (None: no
    images) and, for image stores, the CPU cost of each stage (``stages.stage_costs``)."""

    url: str
    source: StoreSource
    shape: tuple[int, ...]
    sample_bytes: int
    image_storage: str | None = None
    stages: StageCosts | None = None


def store_variants(cfg: MatrixConfig, images: bool) -> dict[str, tuple[str, str | None]]:
    """The stores the matrix compares, name -> (format, image storage). An image folder gives
    one compacted store per format and --image-storage, named FORMAT-STORAGE (parquet-encoded,
    parquet-decoded); the small files keep their name, blob (encoded images)."""
    if not images:
        return {name: (name, None) for name in cfg.stores}
    return {(name if name == IN_PLACE else f"{name}-{storage}"): (name, "encoded" if name == IN_PLACE else storage)
            for name in cfg.stores for storage in (("encoded",) if name == IN_PLACE else cfg.image_storage)}


def stage_stores(cfg: MatrixConfig, backend: Backend, log: Callable[[str], None]) -> tuple[list[str], dict[str,
                 Staged], dict[str, str]]:
    """Stage every store on the backend and open it as the cells will: the store names in
    order (``store_variants``), name -> Staged for those that open, name -> the redacted reason
    for those that do not (their cells fail, the others run). The compacted stores are
    converted from the small files as staged."""
    try:
        small_files, labels = stage_small_files(cfg.src, cfg.labels_csv, cfg.storage_options, backend, log)
    except Exception as exc:  # every store's cells fail, with the reason; the report says it
        reason = why(exc)
        log(f"stage small files: failed: {reason}")
        return list(cfg.stores), {}, dict.fromkeys(cfg.stores, reason)
    blob = backend.source(small_files, IN_PLACE, labels)
    try:
        images = open_store(blob.path, blob.fmt, reader_options(cfg, blob).open).images is not None
    except UsageError:
        raise
    except Exception:
        images = None  # unknown: the small files do not open; the loop below records why, store by store
    if cfg.resize and images is False:
        raise UsageError(f"--resize: {cfg.src} holds no JPEG/PNG images")
    variants = store_variants(cfg, bool(images))
    opened, failed = {}, {}
    for name, (fmt, storage) in variants.items():
        try:
            image = ImageOptions(resize=cfg.resize, storage=storage or "encoded", mode=cfg.image_mode,
                                 reduce_depth=cfg.reduce_depth, promote_depth=cfg.promote_depth)
            url = small_files if fmt == IN_PLACE else stage_store(fmt, small_files, labels, backend, log, name, image,
                                                                  cfg.arrays)
            src = blob if fmt == IN_PLACE else backend.source(url, fmt)
            store = open_store(src.path, src.fmt, reader_options(cfg, src).open)
            spec, shape = store.sample_spec, model_shape(store, cfg.arrays.channels)
            stages = _logged_stages(log, name, store) if images else None
        except UsageError:
            raise
        except Exception as exc:  # this store's cells fail, with the reason; the others run
            failed[name] = why(exc)
            log(f"stage {name}: failed: {failed[name]}")
        else:
            assert spec.shape is not None, "raw arrays and decoded images have a fixed shape"
            opened[name] = Staged(url, src, shape, int(np.prod(spec.shape)) * np.dtype(spec.dtype).itemsize,
                                  storage, stages)
    return list(variants), opened, failed


def model_shape(store: OpenedStore, channels: str | None = None) -> tuple[int, ...]:
    """The shape the models take the store's samples in, by train's own rule (an (H, W) sample
    gains a channel axis; channels first, as ``channels`` or the store says, are moved last; a
    shape no model takes, or one that looks channels-first unsaid, is refused), labeled or not:
    reading an unlabeled store is measured too, and a real-node cell, which trains, says labels
    are missing."""
    spec = replace(store.spec, channels=channels or store.spec.channels)
    listing = replace(store.listing, spec=spec, schema=replace(store.schema, labeled=True))
    return model_input_shape(replace(store, listing=listing))


def _logged_stages(log: Callable[[str], None], name: str, store: OpenedStore) -> StageCosts:
    costs = stage_costs(store)
    log(f"stages {name}: CPU per sample " + ", ".join(f"{s} {getattr(costs, s) * 1e3:.3f} ms" for s in STAGES)
        + f" ({costs.samples} samples)")
    return costs


def reader_options(cfg: MatrixConfig, src: StoreSource) -> CellReading:
    # a shuffle buffer of two batches: a larger one would make the first step read far ahead
    # and the short measured window flow from memory; no disk cache: every cell reads the storage;
    # full batches only, as the training loop reads
    return CellReading(OpenOptions(labels=src.labels_csv, storage_options=src.storage_options,
                                   io_concurrency=cfg.io_concurrency, image_size=cfg.resize, fit=cfg.fit,
                                   cast=cfg.arrays.dtype if src.fmt == IN_PLACE else None),
                       EpochOptions(batch_size=cfg.batch_size, workers=cfg.workers, shuffle=True, seed=0,
                                    shuffle_buffer=2 * cfg.batch_size, pool="arrow", drop_last=True))


def connections(cfg: MatrixConfig, backend: Backend) -> dict[str, int | None]:
    """The connection budget every cell reads with, whatever the layout: ``workers`` reader
    threads and, on object storage or behind the emulation, ``io_concurrency`` range requests
    in flight for the whole reader. Local reads as they are have no request budget: None."""
    remote = backend.kind != "local" or bool(backend.profile)
    return {"reader_workers": cfg.workers, "io_concurrency": cfg.io_concurrency if remote else None}
