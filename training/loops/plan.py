"""Everything checked before the first step: the stores opened (training and --eval-data), the
reader options, the steps per epoch, the model's input shape and classes."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from trainfeed.converters.errors import TrainfeedError, UsageError
from trainfeed.converters.layout import FieldSpec, looks_channels_first
from trainfeed.training.config import TrainConfig, distributed_env
from trainfeed.training.reading.readers import batches_per_rank, label_bounds, open_store
from trainfeed.training.reading.store import Batch, EpochOptions, OpenedStore


@dataclass
class Plan:
    store: OpenedStore
    epoch: EpochOptions  # how this rank reads a training epoch
    steps_per_epoch: int
    num_classes: int
    input_shape: tuple[int, ...]  # of one sample as the model takes it (channels last)
    rank: int
    world: int
    channels_first: bool = False  # the store's samples have their channels first: moved last for the model
    eval_store: OpenedStore | None = None
    notes: list[str] = field(default_factory=list)  # said on stderr before training (what the data is read as)


def train_epoch(cfg: TrainConfig, rank: int = 0, world: int = 1) -> EpochOptions:
    """This rank's training epochs. The loop's own choice, not a default: it drops the short
    tail, so that every step is a full global batch (the same number on every rank); a short
    batch would be read for nothing (or, from the tf.data service, delivered before the
    epoch's end)."""
    if cfg.epoch.global_batch_size is not None and cfg.epoch.global_batch_size % world:
        raise UsageError(f"{cfg.option('global_batch_size')}{cfg.epoch.global_batch_size} cannot be shared evenly by "
                         f"{world} ranks: use a multiple of {world}")
    return replace(cfg.epoch_options(rank, world), drop_last=True)


def eval_epoch(cfg: TrainConfig) -> EpochOptions:
    """The held-out store: every sample once, in order, not augmented."""
    return replace(cfg.epoch_options(), shuffle=False, drop_last=False, augment=False)


def plan(cfg: TrainConfig) -> Plan:
    """Everything checked before the first step: the training store, the steps, the
    warm-up, and the --eval-data store."""
    rank, world, _ = distributed_env()
    opts = train_epoch(cfg, rank, world)
    store = open_store(cfg.data, cfg.fmt, cfg.store, opts.pool)
    if cfg.store.image_size is not None and store.images is None:
        raise UsageError(f"--image-size applies to encoded images (JPEG/PNG); {store.path} holds "
                         f"{store.spec.dtype} arrays of shape {_shape(store.spec)}")
    if cfg.data_service:
        from trainfeed.training.reading.service_input import check_reachable, check_store

        check_store(store)
        check_reachable(cfg.data_service)
    input_shape = model_input_shape(store, cfg)
    full = batches_per_rank(store, opts)
    steps = min(full, cfg.steps_per_epoch) if cfg.steps_per_epoch else full
    if cfg.warmup_steps > cfg.epochs * steps:
        raise UsageError(f"--warmup-steps {cfg.warmup_steps} is more than the {cfg.epochs * steps} steps of this run "
                         f"({cfg.epochs} epochs of {steps})")
    num_classes = classes(cfg, store)
    p = Plan(store, opts, steps, num_classes, input_shape, rank, world, channels_first(store, cfg))
    spec = store.sample_spec
    if len(input_shape) == 3 and len(_shape(spec)) == 3 and store.images is None and spec.name != "image":
        p.notes.append(f"{store.path}: field {spec.name!r} holds samples of shape {_shape(spec)}, read as images "
                       f"(H, W, C) = {_shape(spec)} by the 2D ResNet; a volume is (X, Y, Z, C): give its "
                       "samples a channel axis to train the 3D one")
    if cfg.eval_data:
        p.eval_store = open_eval_store(cfg, p)
    return p


def _shape(spec: FieldSpec) -> tuple[int, ...]:
    """The shape of a field that has a fixed one: raw arrays (an image store's samples are
    decoded to one size), and every store ``model_input_shape`` accepted."""
    assert spec.shape is not None, f"field {spec.name!r} has no fixed shape"
    return tuple(spec.shape)


def classes(cfg: TrainConfig, store: OpenedStore) -> int:
    """The classes the model predicts: ``num_classes``, else the store's label map, else (integer
    labels, no map) the highest label + 1, at least 2. Checked against the store's labels before
    training (a label outside them would otherwise stop the run at the first batch that holds it)."""
    label_map = store.schema.label_map
    if label_map:  # trainfeed numbered the classes 0..n-1: the map bounds them, nothing to read
        bounds = (min(label_map.values()), max(label_map.values())) if cfg.num_classes else None
    else:
        bounds = label_bounds(store)
    if cfg.num_classes:
        n = cfg.num_classes
    elif label_map:
        n = len(label_map)
    else:
        n = max(2, bounds[1] + 1) if bounds and bounds[0] >= 0 else 2
    if bounds is not None and (bounds[0] < 0 or bounds[1] >= n):
        if bounds[0] < 0:
            raise TrainfeedError(f"{store.path}: some samples have no label (-1); training needs every sample "
                                 "labeled: convert it again with a label for each")
        raise TrainfeedError(f"{store.path}: labels range over {bounds[0]}..{bounds[1]}, the model predicts "
                             f"0..{n - 1}; set {cfg.option('num_classes')}{bounds[1] + 1} (or leave it out: "
                             "the default is the highest label + 1)")
    return n


def channels_first(store: OpenedStore, cfg: TrainConfig | None = None) -> bool:
    """Whether the store's samples have their channel axis first: as ``cfg.channels`` says,
    else as the store records it, else last; a shape that looks channels-first (3, 224, 224)
    with neither is refused rather than guessed."""
    spec = store.sample_spec
    said = (cfg.channels if cfg is not None else None) or spec.channels
    if said is None and spec.is_raw and spec.shape is not None and looks_channels_first(tuple(spec.shape)):
        flag = cfg.option("channels") if cfg is not None else "--channels "
        raise UsageError(f"{store.path}: field {spec.name!r} holds samples of shape {tuple(spec.shape)}, which looks "
                         f"channels-first, and the store does not say: give {flag}first to move the channels last "
                         f"for the model, or {flag}last if the last axis is the channels")
    return said == "first"


def model_input_shape(store: OpenedStore, cfg: TrainConfig | None = None) -> tuple[int, ...]:
    """One sample's shape as the models take it: (X, Y, Z, C) volumes, (H, W, C) images, and
    (H, W) greyscale images given their channel axis; a channels-first sample with its channels
    moved last. Refuses what no model can train on."""
    spec, path = store.sample_spec, store.path
    if spec.shape is None:
        if spec.is_ragged:
            flag = cfg.option("fit") if cfg is not None else "--fit "
            raise TrainfeedError(f"{path}: field {spec.name!r} holds samples of different shapes: choose how to "
                                 f"batch them, {flag}pad:SHAPE, crop:SHAPE or resize:SHAPE (e.g. pad:64x64)")
        raise TrainfeedError(f"{path}: field {spec.name!r} has no fixed shape")
    if not store.schema.labeled:
        cli = cfg is None or cfg.cli
        fix = ("convert it again with labels: `convert SRC DST --labels labels.csv` (a CSV of id,label) or from "
               "class subfolders; for a folder of small files, `train --labels labels.csv`" if cli else
               "convert it again with labels: `convert(src, dst, labels=\"labels.csv\")` (a CSV of id,label) or "
               "from class subfolders; for a folder of small files, "
               "`TrainConfig(store=OpenOptions(labels=\"labels.csv\"))`")
        raise TrainfeedError(f"{path}: store is unlabeled; training needs a label column: {fix}")
    shape = tuple(spec.shape)
    if channels_first(store, cfg):
        shape = (*shape[1:], shape[0])
    if len(shape) == 2:
        return (*shape, 1)
    if len(shape) not in (3, 4):
        raise TrainfeedError(f"{path}: field {spec.name!r} holds samples of shape {shape}; the models take images "
                             "(H, W) or (H, W, C) and volumes (X, Y, Z, C)")
    return shape


def as_model_input(batch: Batch, shape: tuple[int, ...], channels_first: bool = False) -> np.ndarray:
    """The batch's samples in the model's shape (a view: a channel axis may be added, or moved
    from first to last)."""
    x = np.moveaxis(batch.x, 1, -1) if channels_first else batch.x
    return x.reshape((len(batch.ids), *shape))


def open_eval_store(cfg: TrainConfig, p: Plan) -> OpenedStore:
    """The --eval-data store, refused before training unless the trained model can score it:
    same field, sample shape and dtype, labeled, labels within the model's classes."""
    assert cfg.eval_data is not None, "opened only with --eval-data"
    # the field the model trains on; its labels and version are --data's, not this store's
    opened = replace(cfg.store, version=None, labels=None, field=p.store.spec.name)
    store = open_store(cfg.eval_data, None, opened, cfg.epoch.pool)
    shape, train, held_out = model_input_shape(store, cfg), p.store.sample_spec, store.sample_spec
    if shape != p.input_shape or held_out.dtype != train.dtype:
        raise TrainfeedError(f"{cfg.eval_data}: --eval-data field {held_out.name!r} holds {held_out.dtype} "
                             f"samples of shape {_shape(held_out)}; the model trains on {train.dtype} "
                             f"samples of shape {_shape(train)} from --data"
                             + (f"; {'--image-size HxW' if cfg.cli else 'image_size=(H, W)'} decodes both to one size"
                                if store.images and p.store.images and not cfg.store.image_size else ""))
    check_label_maps(p.store, store)
    bounds = label_bounds(store)
    if bounds is not None and (bounds[0] < 0 or bounds[1] >= p.num_classes):
        unlabeled = " (-1: samples without a label)" if bounds[0] < 0 else ""
        raise TrainfeedError(f"{cfg.eval_data}: --eval-data labels range over {bounds[0]}..{bounds[1]}{unlabeled}, "
                             f"the model predicts 0..{p.num_classes - 1} (set {cfg.option('num_classes')}N if the "
                             "data has more classes)")
    return store


def check_label_maps(train: OpenedStore, held_out: OpenedStore) -> None:
    """A class name must have the same index in both stores (else accuracy compares apples with pears)."""
    ours, theirs = train.schema.label_map or {}, held_out.schema.label_map or {}
    for name, index in theirs.items():
        if name in ours and ours[name] != index:
            raise TrainfeedError(f"{held_out.path}: class {name!r} is label {index} in --eval-data but {ours[name]} "
                                 "in --data; convert both with the same labels")


def check_labels(batch: Batch, num_classes: int, path: str, flag: str = "num_classes=") -> None:
    bad = (batch.y < 0) | (batch.y >= num_classes)
    if bad.any():
        i = int(np.argmax(bad))
        raise TrainfeedError(f"{path}: sample {batch.ids[i]!r} has label {int(batch.y[i])}, "
                             f"outside 0..{num_classes - 1} (set {flag}N if the store has more classes)")
