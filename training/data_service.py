"""Run a tf.data service on this machine, for ``train --data-service`` (either --framework):

    python -m trainfeed.training.data_service dispatcher --port 5050
    python -m trainfeed.training.data_service worker --dispatcher grpc://localhost:5050 --port 5051
    python -m trainfeed.training.data_service measure --data IMAGES --image-size 64x64 [--service grpc://...]

The servers are TensorFlow's (``tf.data.experimental.service.DispatchServer`` and
``WorkerServer``); each command serves until it is stopped (SIGTERM / Ctrl-C). ``measure``
times the offloaded input pipeline alone (images/s), in this process without --service.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import typer

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def dispatcher(port: int) -> None:
    import tensorflow as tf

    server = tf.data.experimental.service.DispatchServer(tf.data.experimental.service.DispatcherConfig(port=port))
    print(f"dispatcher serving at {server.target}", flush=True)
    server.join()


def worker(address: str, port: int, host: str) -> None:
    import tensorflow as tf

    from trainfeed.training.reading.service_input import dispatcher_host_port

    dispatcher_host, dispatcher_port = dispatcher_host_port(address, "--dispatcher")
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=f"{dispatcher_host}:{dispatcher_port}", port=port, worker_address=f"{host}:%port%")
    server = tf.data.experimental.service.WorkerServer(config)
    print(f"worker serving on port {port} for {address}", flush=True)
    server.join()


def measure(data: str, image_size: tuple[int, int], batch_size: int, service: str | None, augment: bool) -> dict:
    """Images/s of one epoch of the offloaded pipeline (read + decode + augment), no training."""
    from trainfeed.training.reading.readers import ReaderOptions, open_store
    from trainfeed.training.reading.service_input import check_reachable, check_store, distributed

    opts = ReaderOptions(batch_size=batch_size, image_size=image_size, augment=augment)
    store = open_store(data, "blob", opts)
    check_store(store)
    if service:
        check_reachable(service)
    t0, n = time.perf_counter(), 0
    for x, _, _ in distributed(store, opts, 0, service, batch_size).as_numpy_iterator():
        n += len(x)
    seconds = time.perf_counter() - t0
    return {"images": n, "seconds": round(seconds, 3), "images_per_s": round(n / seconds, 1),
            "service": service, "image_size": list(image_size), "augment": augment}


def main(argv: list[str] | None = None) -> int:
    from trainfeed.converters.cli import parse_resize
    from trainfeed.converters.cli_common import exit_codes

    parser = argparse.ArgumentParser(prog="python -m trainfeed.training.data_service", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dispatcher", help="Run a dispatcher (train's --data-service grpc://HOST:PORT points here).")
    d.add_argument("--port", type=int, required=True)
    w = sub.add_parser("worker", help="Run a worker that registers with a dispatcher and runs input pipelines.")
    w.add_argument("--dispatcher", required=True, help="grpc://HOST:PORT of the dispatcher.")
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--host", default="localhost", help="How the trainer reaches this worker (default localhost).")
    m = sub.add_parser("measure", help="Images/s of the offloaded input pipeline over one epoch of an image folder.")
    m.add_argument("--data", required=True)
    m.add_argument("--image-size", required=True, help="HEIGHTxWIDTH, e.g. 64x64.")
    m.add_argument("--batch-size", type=int, default=32)
    m.add_argument("--service", default=None, help="grpc://HOST:PORT; default: run the pipeline in this process.")
    m.add_argument("--no-augment", dest="augment", action="store_false")
    args = parser.parse_args(argv)
    try:
        with exit_codes():
            if args.command == "dispatcher":
                dispatcher(args.port)
            elif args.command == "worker":
                worker(args.dispatcher, args.port, args.host)
            else:
                print(json.dumps(measure(args.data, parse_resize(args.image_size, "--image-size"), args.batch_size,
                                         args.service, args.augment)))
    except typer.Exit as exc:  # exit_codes printed the error
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
