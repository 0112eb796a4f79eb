"""TensorFlow for the training loop (loop.py): the Keras model and its optimizer, one
compiled step, prediction, and TensorFlow checkpoints (tensors only, with trainfeed's marker);
and ``tf_dataset``, a store as a ``tf.data.Dataset``."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from trainfeed.converters.errors import TrainfeedError
from trainfeed.training.config import TrainConfig
from trainfeed.training.loops.plan import Plan, as_model_input
from trainfeed.training.loops.resume import CHECKPOINT_FORMAT, Position, check_signature
from trainfeed.training.reading.readers import iter_batches
from trainfeed.training.reading.store import Batch, EpochOptions, OpenedStore
from trainfeed.training.tensorflow_env import import_tensorflow

if TYPE_CHECKING:
    import tensorflow as tf

import_tensorflow()  # its first import here: settings and start-up notices (tensorflow_env.py)


def tf_dataset(store: OpenedStore, opts: EpochOptions, epoch: int = 0, start_batch: int = 0,
               prefetch: int = 2) -> tf.data.Dataset:
    """One epoch of a store as a ``tf.data.Dataset`` of (x, y) batches, x in the stored sample
    shape, from batch ``start_batch`` on (earlier batches are not read)."""
    import tensorflow as tf

    spec = store.sample_spec
    if spec.shape is None:
        raise TrainfeedError(f"{store.path}: field {spec.name!r} has no fixed shape")

    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for batch in iter_batches(store, opts, epoch, start_batch=start_batch):
            yield batch.x, batch.y

    signature = (tf.TensorSpec((None, *spec.shape), tf.as_dtype(np.dtype(spec.dtype))),
                 tf.TensorSpec((None,), tf.int64))
    return tf.data.Dataset.from_generator(gen, output_signature=signature).prefetch(prefetch)


def _to_float(x: tf.Tensor | np.ndarray) -> tf.Tensor:
    import tensorflow as tf

    return tf.cast(x, tf.float32) / 255.0 if x.dtype == tf.uint8 else tf.cast(x, tf.float32)


class TensorFlow:
    """The loop's ``Framework`` for TensorFlow / Keras 3 (see loop.Framework)."""

    def __init__(self, cfg: TrainConfig, p: Plan) -> None:
        import keras
        import tensorflow as tf

        from trainfeed.training.models.resnet_tf import build

        if p.world > 1:
            raise TrainfeedError("multi-process training is the PyTorch path (TorchDistributor); use --framework torch")
        keras.utils.set_random_seed(cfg.epoch.seed)
        if cfg.amp:
            keras.mixed_precision.set_global_policy("mixed_bfloat16" if cfg.device == "cpu" else "mixed_float16")
        self.cfg, self.p = cfg, p
        self.device = "/GPU:0" if cfg.device == "cuda" else "/CPU:0"
        binary = p.num_classes == 2
        with tf.device(self.device):
            self.model = build(p.input_shape, 1 if binary else p.num_classes, cfg.width)
            self.optimizer = keras.optimizers.Adam(cfg.lr)
            if cfg.amp and cfg.device == "cuda":
                self.optimizer = keras.mixed_precision.LossScaleOptimizer(self.optimizer)
            # its slots now, not in the compiled step's first call: a step that creates variables
            # is traced twice (8 of a small run's 23 seconds here)
            self.optimizer.build(self.model.trainable_variables)
            self.position = {name: tf.Variable(0, dtype=tf.int64) for name in ("epoch", "step_in_epoch", "global_step")}
        loss_fn = (keras.losses.BinaryCrossentropy(from_logits=True) if binary
                   else keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model, optimizer = self.model, self.optimizer

        def train_step(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            x = _to_float(x)
            with tf.GradientTape() as tape:
                logits = tf.cast(model(x, training=True), tf.float32)
                target = tf.cast(y, tf.float32)[:, None] if binary else y
                loss = loss_fn(target, logits)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            pred = tf.cast(logits[:, 0] > 0, tf.int64) if binary else tf.argmax(logits, 1)
            return loss, tf.reduce_sum(tf.cast(pred == y, tf.int64))

        self._train_step = tf.function(train_step, reduce_retracing=True)
        self._manager: tf.train.CheckpointManager | None = None
        self._signature: tf.Variable | None = None

    def parameters(self) -> dict[str, int]:
        from trainfeed.training.models.resnet_tf import parameter_count

        return parameter_count(self.model)

    def to_inputs(self, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
        return as_model_input(batch, self.p.input_shape, self.p.channels_first), batch.y

    def step(self, inputs: tuple[np.ndarray, np.ndarray]) -> tuple[float, int]:
        import tensorflow as tf

        with tf.device(self.device):
            loss, hits = self._train_step(*inputs)
        return float(loss.numpy()), int(hits.numpy())  # .numpy() waits for the step: the clock is honest

    def predict(self, x: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        with tf.device(self.device):
            logits = np.asarray(self.model(_to_float(x), training=False), dtype=np.float32)
        return (logits[:, 0] > 0).astype(np.int64) if logits.shape[1] == 1 else logits.argmax(1)

    def _checkpoints(self, signature: str) -> tf.train.CheckpointManager:
        """The CheckpointManager over --checkpoint-dir; the marker and ``signature`` are tensors in it."""
        import tensorflow as tf

        assert self.cfg.checkpoint_dir is not None, "the loop restores and saves only with a --checkpoint-dir"
        if self._manager is None:
            os.makedirs(self.cfg.checkpoint_dir, exist_ok=True)
            self._signature = tf.Variable(signature)
            ckpt = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, **self.position,
                                       format=tf.Variable(CHECKPOINT_FORMAT), signature=self._signature)
            self._manager = tf.train.CheckpointManager(ckpt, self.cfg.checkpoint_dir, max_to_keep=2)
        return self._manager

    def restore(self, signature: str) -> Position | None:
        import tensorflow as tf

        manager = self._checkpoints(signature)
        assert self.cfg.checkpoint_dir is not None, "the loop restores only with a --checkpoint-dir"
        latest = _latest_checkpoint(self.cfg.checkpoint_dir, manager)
        if latest is None:
            return None
        _check_checkpoint(latest, signature)
        with tf.device(self.device):
            self.optimizer.build(self.model.trainable_variables)  # its slots exist, so every saved value has a home
        _restore(manager.checkpoint, latest)
        return Position(*(int(self.position[name].numpy()) for name in ("epoch", "step_in_epoch", "global_step")))

    def save(self, position: Position, signature: str) -> None:
        manager = self._checkpoints(signature)
        for name in self.position:
            self.position[name].assign(getattr(position, name))
        manager.save()


def _latest_checkpoint(directory: str, manager: tf.train.CheckpointManager) -> str | None:
    """The newest checkpoint's prefix, None when the folder holds none yet. TensorFlow takes an
    unreadable 'checkpoint' state file for no checkpoint at all: here that is an error."""
    if manager.latest_checkpoint:
        return str(manager.latest_checkpoint)
    leftovers = sorted(name for name in os.listdir(directory) if name == "checkpoint" or name.endswith(".index"))
    if leftovers:
        raise TrainfeedError(f"{directory}: holds TensorFlow checkpoint files ({', '.join(leftovers[:3])}) but no "
                             "readable checkpoint: its 'checkpoint' state file is damaged or names files that are "
                             "gone; use another --checkpoint-dir")
    return None


def _check_checkpoint(prefix: str, signature: str) -> None:
    """Read the format marker and what the checkpoint was written for, before restoring
    anything (a TensorFlow checkpoint holds tensors and protocol buffers: no code)."""
    import tensorflow as tf

    try:
        reader = tf.train.load_checkpoint(prefix)
        stored = {name: reader.get_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE") for name in ("format", "signature")
                  if reader.has_tensor(f"{name}/.ATTRIBUTES/VARIABLE_VALUE")}
    except (tf.errors.OpError, ValueError, IndexError) as exc:  # IndexError: TensorFlow's "read less bytes"
        raise TrainfeedError(f"{prefix}: not a readable TensorFlow checkpoint (damaged?): "
                             f"{type(exc).__name__}: {_first_line(exc)}") from None
    if stored.get("format") != CHECKPOINT_FORMAT.encode():
        raise TrainfeedError(f"{prefix}: not a trainfeed checkpoint (no {CHECKPOINT_FORMAT!r} marker)")
    check_signature(prefix, bytes(stored.get("signature", b"")).decode(errors="replace"), signature)


def _restore(ckpt: tf.train.Checkpoint, prefix: str) -> None:
    """Every value in the checkpoint must land in this model and optimizer, and every one of
    their variables must get a value: a partial restore would train from a silent mix."""
    import tensorflow as tf

    try:
        ckpt.restore(prefix).assert_consumed()
    except (AssertionError, ValueError, IndexError, tf.errors.OpError) as exc:
        raise TrainfeedError(f"{prefix}: checkpoint cannot be restored into this model (damaged, or written for "
                             f"another model): {type(exc).__name__}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else ""


def compute_only(shape: tuple[int, ...], batch: int, width: int, steps: int, device: str = "cpu",
                 amp: bool = False) -> tuple[float, float]:
    """As loop_torch.compute_only, for the Keras model; ``device`` and ``amp`` are not applied:
    TensorFlow places the step itself, at full precision."""
    import keras
    import tensorflow as tf

    from trainfeed.training.models.resnet_tf import build

    model = build(tuple(shape), 1, width)
    opt = keras.optimizers.Adam()
    opt.build(model.trainable_variables)  # its slots before the step: traced once (as TensorFlow.__init__)
    x = tf.random.normal((batch, *shape))
    y = tf.cast(tf.random.uniform((batch, 1)) > 0.5, tf.float32)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def one_step() -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    step = tf.function(one_step)
    times, cpu = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step().numpy()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return float(np.median(times[1:])), float(np.mean(cpu[1:]))
