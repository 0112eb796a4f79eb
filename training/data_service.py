"""`python -m trainfeed.training.data_service`: a command users start (README, `train
--data-service`), not a process trainfeed starts itself. Runs a tf.data service on this machine, for
``train --data-service`` (either --framework):

    python -m trainfeed.training.data_service dispatcher --port 5050
    python -m trainfeed.training.data_service worker --dispatcher grpc://localhost:5050 --port 5051
    python -m trainfeed.training.data_service measure --data IMAGES --image-size 64x64 [--service grpc://...]

The servers are TensorFlow's (``tf.data.experimental.service.DispatchServer`` and
``WorkerServer``); each command serves until it is stopped (SIGTERM / Ctrl-C). ``measure``
times the offloaded input pipeline alone (images/s), in this process without --service.
"""
from __future__ import annotations

import json
import time
from typing import Any

import typer

from trainfeed.converters.errors import exit_codes
from trainfeed.converters.sources.decode import parse_resize
from trainfeed.training.tensorflow_env import import_tensorflow


def dispatcher(port: int) -> None:
    tf = import_tensorflow()

    server = tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(port=port))
    print(f"dispatcher serving at {server.target}", flush=True)
    server.join()


def worker(address: str, port: int, host: str) -> None:
    tf = import_tensorflow()

    from trainfeed.training.reading.service_input import dispatcher_host_port

    dispatcher_host, dispatcher_port = dispatcher_host_port(address, "--dispatcher")
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=f"{dispatcher_host}:{dispatcher_port}", port=port, worker_address=f"{host}:%port%")
    server = tf.data.experimental.service.WorkerServer(config)
    print(f"worker serving on port {port} for {address}", flush=True)
    server.join()


def measure(data: str, image_size: tuple[int, int], batch_size: int, service: str | None,
            augment: bool) -> dict[str, Any]:
    """Images/s of one epoch of the offloaded pipeline (read + decode + augment), no training."""
    from trainfeed.converters.formats.options import OpenOptions
    from trainfeed.training.reading.readers import open_store
    from trainfeed.training.reading.service_input import check_reachable, check_store, distributed
    from trainfeed.training.reading.store import EpochOptions

    opts = EpochOptions(batch_size=batch_size, augment=augment)
    store = open_store(data, "blob", OpenOptions(image_size=image_size))
    check_store(store)
    if service:
        check_reachable(service)
    t0, n = time.perf_counter(), 0
    for x, _, _ in distributed(store, opts, 0, service, batch_size).as_numpy_iterator():
        n += len(x)
    seconds = time.perf_counter() - t0
    return {"images": n, "seconds": round(seconds, 3), "images_per_s": round(n / seconds, 1),
            "service": service, "image_size": list(image_size), "augment": augment}


app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Run a tf.data service on this machine, for `train --data-service` (either --framework):"
                       "\n\n\b\n"
                       "  python -m trainfeed.training.data_service dispatcher --port 5050\n"
                       "  python -m trainfeed.training.data_service worker --dispatcher grpc://localhost:5050 "
                       "--port 5051\n"
                       "  python -m trainfeed.training.data_service measure --data IMAGES --image-size 64x64 "
                       "[--service grpc://...]\n\n"
                       "The servers are TensorFlow's (DispatchServer and WorkerServer); each command serves until "
                       "it is stopped (SIGTERM / Ctrl-C). `measure` times the offloaded input pipeline alone "
                       "(images/s), in this process without --service.")


@app.command("dispatcher", help="Run a dispatcher (train's --data-service grpc://HOST:PORT points here).")
def dispatcher_command(port: int = typer.Option(..., "--port")) -> None:
    with exit_codes():
        dispatcher(port)


@app.command("worker", help="Run a worker that registers with a dispatcher and runs input pipelines.")
def worker_command(
    address: str = typer.Option(..., "--dispatcher", help="grpc://HOST:PORT of the dispatcher."),
    port: int = typer.Option(..., "--port"),
    host: str = typer.Option("localhost", "--host", help="How the trainer reaches this worker."),
) -> None:
    with exit_codes():
        worker(address, port, host)


@app.command("measure", help="Images/s of the offloaded input pipeline over one epoch of an image folder.")
def measure_command(
    data: str = typer.Option(..., "--data"),
    image_size: str = typer.Option(..., "--image-size", help="HEIGHTxWIDTH, e.g. 64x64."),
    batch_size: int = typer.Option(32, "--batch-size"),
    service: str | None = typer.Option(None, "--service", help="grpc://HOST:PORT; default: run the pipeline in "
                                          "this process."),
    no_augment: bool = typer.Option(False, "--no-augment"),
) -> None:
    with exit_codes():
        size = parse_resize(image_size, "--image-size")
        assert size is not None, "--image-size is required"
        print(json.dumps(measure(data, size, batch_size, service, not no_augment)))


def main() -> None:
    app(prog_name="python -m trainfeed.training.data_service")


if __name__ == "__main__":
    main()
