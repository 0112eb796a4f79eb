"""The TensorFlow training loop: the same readers through tf.data, the same step accounting,
checkpoints, SIGTERM-safe preemption and resume (tf.train.Checkpoint)."""
from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from converters.errors import TrainfeedError  # noqa: E402
from converters.progress import progress_bar  # noqa: E402

from .config import TrainConfig, distributed_env  # noqa: E402
from .metrics import StepTimer, UtilizationSampler  # noqa: E402
from .readers import Batch, ReaderOptions, Store, iter_batches, open_store  # noqa: E402
from .run import Preemption, RunFiles, after_step, check_labels, plan, reader_options, record, summarize  # noqa: E402


def tf_dataset(store: Store, opts: ReaderOptions, epoch: int = 0, num_classes: int | None = None,
               skip: int = 0, prefetch: int = 2):
    """One epoch of a store as a ``tf.data.Dataset`` of (x, y, nbytes) batches."""
    import tensorflow as tf

    spec = store.spec

    def gen():
        batches = iter_batches(store, opts, epoch)
        for _ in range(skip):
            next(batches, None)
        for batch in batches:
            if num_classes is not None:
                check_labels(batch, num_classes, store.path)
            yield batch.x, batch.y

    signature = (tf.TensorSpec((None, *spec.shape), tf.as_dtype(np.dtype(spec.dtype))),
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

    ckpt = manager = None
    start_epoch = skip = 0
    if cfg.checkpoint_dir:
        os.makedirs(cfg.checkpoint_dir, exist_ok=True)
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch_var,
                                   step_in_epoch=step_in_epoch_var, global_step=global_var)
        manager = tf.train.CheckpointManager(ckpt, cfg.checkpoint_dir, max_to_keep=2)
        sig_file = os.path.join(cfg.checkpoint_dir, "signature")
        if cfg.resume and manager.latest_checkpoint:
            if open(sig_file).read() != cfg.signature():
                raise TrainfeedError(f"{cfg.checkpoint_dir}: checkpoint was written for other data or another model")
            ckpt.restore(manager.latest_checkpoint)
            start_epoch, skip = int(epoch_var.numpy()), int(step_in_epoch_var.numpy())
            if skip >= p.steps_per_epoch:
                start_epoch, skip = start_epoch + 1, 0
        with open(sig_file, "w") as fh:
            fh.write(cfg.signature())

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
    if cfg.eval_data and not preempted:
        extra["eval"] = evaluate(cfg, model, p.num_classes)
    summary = summarize(cfg, p, timer, util, extra)
    files.write_summary(summary)
    files.close()
    return summary


def evaluate(cfg: TrainConfig, model, num_classes: int) -> dict:
    opts = reader_options(cfg, shuffle=False)
    opts = type(opts)(**{**opts.__dict__, "drop_last": False, "delta_version": None, "labels_csv": None})
    store = open_store(cfg.eval_data, None, opts)
    correct = total = 0
    for batch in iter_batches(store, opts):
        logits = np.asarray(model(_to_float(batch.x), training=False), dtype=np.float32)
        pred = (logits[:, 0] > 0).astype(np.int64) if logits.shape[1] == 1 else logits.argmax(1)
        correct += int((pred == batch.y).sum())
        total += len(batch.ids)
    return {"store": cfg.eval_data, "samples": total, "accuracy": round(correct / total, 4) if total else None}


__all__ = ["train", "tf_dataset", "Batch"]
