"""The TensorFlow training loop: the same readers through tf.data, the same step accounting,
checkpoints, SIGTERM-safe preemption and resume (tf.train.Checkpoint)."""
from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from trainfeed.converters.errors import TrainfeedError  # noqa: E402
from trainfeed.converters.progress import progress_bar  # noqa: E402

from .config import TrainConfig, distributed_env  # noqa: E402
from .metrics import StepTimer, UtilizationSampler  # noqa: E402
from .readers import Batch, ReaderOptions, Store, iter_batches  # noqa: E402
from .run import (CHECKPOINT_FORMAT, Plan, Preemption, RunFiles, after_step, as_model_input,  # noqa: E402
                  check_labels, checkpoint_signature, eval_options, model_input_shape, notice, plan, record,
                  summarize)


def tf_dataset(store: Store, opts: ReaderOptions, epoch: int = 0, num_classes: int | None = None,
               skip: int = 0, prefetch: int = 2):
    """One epoch of a store as a ``tf.data.Dataset`` of (x, y, nbytes) batches."""
    import tensorflow as tf

    shape = model_input_shape(store)

    def gen():
        batches = iter_batches(store, opts, epoch)
        for _ in range(skip):
            next(batches, None)
        for batch in batches:
            if num_classes is not None:
                check_labels(batch, num_classes, store.path)
            yield as_model_input(batch, shape), batch.y

    signature = (tf.TensorSpec((None, *shape), tf.as_dtype(np.dtype(store.spec.dtype))),
                 tf.TensorSpec((None,), tf.int64))
    return tf.data.Dataset.from_generator(gen, output_signature=signature).prefetch(prefetch)


def _to_float(x):
    import tensorflow as tf

    return tf.cast(x, tf.float32) / 255.0 if x.dtype == tf.uint8 else tf.cast(x, tf.float32)


def train(cfg: TrainConfig) -> dict:
    import keras
    import tensorflow as tf

    from .models_tf import build, parameter_count

    rank, world, _ = distributed_env()
    if world > 1:
        raise TrainfeedError("multi-process training is the PyTorch path (TorchDistributor); use --framework torch")
    keras.utils.set_random_seed(cfg.seed)
    if cfg.amp:
        keras.mixed_precision.set_global_policy("mixed_bfloat16" if cfg.device == "cpu" else "mixed_float16")
    p = plan(cfg)
    device = "/GPU:0" if cfg.device == "cuda" else "/CPU:0"
    binary = p.num_classes == 2
    with tf.device(device):
        model = build(p.input_shape, 1 if binary else p.num_classes, cfg.width)
        optimizer = keras.optimizers.Adam(cfg.lr)
        if cfg.amp and cfg.device == "cuda":
            optimizer = keras.mixed_precision.LossScaleOptimizer(optimizer)
        epoch_var = tf.Variable(0, dtype=tf.int64)
        step_in_epoch_var = tf.Variable(0, dtype=tf.int64)
        global_var = tf.Variable(0, dtype=tf.int64)
    loss_fn = (keras.losses.BinaryCrossentropy(from_logits=True) if binary
               else keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    @tf.function(reduce_retracing=True)
    def train_step(x, y):
        x = _to_float(x)
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            target = tf.cast(y, tf.float32)[:, None] if binary else y
            loss = loss_fn(target, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        pred = tf.cast(logits[:, 0] > 0, tf.int64) if binary else tf.argmax(logits, 1)
        return loss, tf.reduce_sum(tf.cast(pred == y, tf.int64))

    manager = None
    start_epoch = skip = 0
    if cfg.checkpoint_dir:
        os.makedirs(cfg.checkpoint_dir, exist_ok=True)
        signature = checkpoint_signature(cfg, p)
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_var,
                                   step_in_epoch=step_in_epoch_var, global_step=global_var,
                                   format=tf.Variable(CHECKPOINT_FORMAT), signature=tf.Variable(signature))
        manager = tf.train.CheckpointManager(ckpt, cfg.checkpoint_dir, max_to_keep=2)
        latest = _latest_checkpoint(cfg.checkpoint_dir, manager) if cfg.resume else None
        if latest:
            _check_checkpoint(latest, signature)
            with tf.device(device):
                optimizer.build(model.trainable_variables)  # its slots exist, so every saved value has a home
            _restore(ckpt, latest)
            start_epoch, skip = int(epoch_var.numpy()), int(step_in_epoch_var.numpy())
            if skip >= p.steps_per_epoch:
                start_epoch, skip = start_epoch + 1, 0
        elif cfg.resume:
            notice(f"--resume: no checkpoint in {cfg.checkpoint_dir} yet: starting from the first step")

    def checkpoint(epoch: int, step_in_epoch: int) -> None:
        if manager is not None:
            epoch_var.assign(epoch)
            step_in_epoch_var.assign(step_in_epoch)
            manager.save()

    files = RunFiles(cfg.out, rank)
    timer = StepTimer(warmup_steps=cfg.warmup_steps, sink=files.steps)
    global_step = int(global_var.numpy())
    first_step = global_step
    preempted = False
    correct = seen = 0
    t_start = time.perf_counter()
    with UtilizationSampler(sink=files.util) as util, Preemption() as preemption, \
            progress_bar(enabled=cfg.progress, label="train", unit="steps") as bar, tf.device(device):
        bar.start(cfg.epochs * p.steps_per_epoch)
        for epoch in range(start_epoch, cfg.epochs):
            it = iter(tf_dataset(p.store, p.reader, epoch, p.num_classes, skip))
            for step_in_epoch in range(skip, p.steps_per_epoch):
                t0 = time.perf_counter()
                try:
                    x, y = next(it)
                except StopIteration:
                    break
                t1 = time.perf_counter()
                loss, hits = train_step(x, y)
                loss = float(loss.numpy())  # waits for the step to finish: the clock is honest
                compute = time.perf_counter() - t1
                global_step += 1
                global_var.assign(global_step)
                correct += int(hits.numpy())
                seen += int(y.shape[0])
                record(timer, global_step, epoch, t1 - t0, compute, int(y.shape[0]),
                       int(np.prod(x.shape)) * x.dtype.size, loss)
                bar.update(global_step - first_step, 0)
                if after_step(cfg, global_step, preemption, lambda: checkpoint(epoch, step_in_epoch + 1)):
                    preempted = True
                    break
            skip = 0
            if preempted:
                break
        if not preempted:
            checkpoint(cfg.epochs, 0)
    extra = {"parameters": parameter_count(model), "train_accuracy": round(correct / seen, 4) if seen else None,
             "preempted": preempted, "global_step": global_step, "resumed_from_step": first_step if cfg.resume else None,
             "run_seconds": round(time.perf_counter() - t_start, 3)}
    if p.eval_store is not None and not preempted:
        extra["eval"] = evaluate(cfg, p, model)
    summary = summarize(cfg, p, timer, util, extra)
    files.write_summary(summary)
    files.close()
    return summary


def _latest_checkpoint(directory: str, manager) -> str | None:
    """The newest checkpoint's prefix, None when the folder holds none yet. TensorFlow takes an
    unreadable 'checkpoint' state file for no checkpoint at all: here that is an error."""
    if manager.latest_checkpoint:
        return manager.latest_checkpoint
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
    if stored.get("signature") != signature.encode():
        raise TrainfeedError(f"{prefix}: checkpoint was written for other data or another model; "
                             "use a fresh --checkpoint-dir")


def _restore(ckpt, prefix: str) -> None:
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


def evaluate(cfg: TrainConfig, p: Plan, model) -> dict:
    """Accuracy on the held-out store (every sample once, no shuffling)."""
    correct = total = 0
    for batch in iter_batches(p.eval_store, eval_options(cfg, p.store.spec.name)):
        logits = np.asarray(model(_to_float(as_model_input(batch, p.input_shape)), training=False), dtype=np.float32)
        pred = (logits[:, 0] > 0).astype(np.int64) if logits.shape[1] == 1 else logits.argmax(1)
        correct += int((pred == batch.y).sum())
        total += len(batch.ids)
    return {"store": cfg.eval_data, "samples": total, "accuracy": round(correct / total, 4) if total else None}


__all__ = ["train", "tf_dataset", "Batch"]
