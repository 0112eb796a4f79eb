"""How random an epoch's order is (``python -m trainfeed.benchmarks.micro.shuffle_quality``): JSON
lines, computed from row counts alone (nothing is read, nothing timed).

The store is laid out as ``convert`` writes one (``--pieces`` row groups of ``--rows`` rows, the
last one shorter), in the worst order for a shuffle: the first half of the samples labelled 0,
the second half 1, as a folder sorted by class would be. For the order with the default
lanes, with one lane (one shuffle window of ``shuffle_buffer`` rows at a time, the engine's
order before lanes) and a full random permutation, per epoch:

- ``pieces_per_batch``: distinct pieces in a global batch (mean and least);
- ``one_piece_batches``: the fraction of batches whose samples all come from one piece;
- ``batch_label_skew``: mean |share of label 1 in a batch - 0.5| (0: every batch half and half);
- ``batch_autocorrelation``: of the batches' shares of label 1, consecutive batches (lag 1; 0: no
  trace of the layout from one step to the next). Within a batch the order does not matter to
  a training step (and the engine groups a batch's rows by piece).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from trainfeed.training.reading.order import EpochOrder, default_lanes


def metrics(batches: list[np.ndarray], piece_of: np.ndarray, label_of: np.ndarray) -> dict[str, Any]:
    pieces = [len(set(piece_of[b].tolist())) for b in batches]
    shares = np.array([label_of[b].mean() for b in batches])
    centred = shares - shares.mean()
    auto = float((centred[1:] * centred[:-1]).sum() / (centred * centred).sum())
    return {"pieces_per_batch": round(float(np.mean(pieces)), 2), "least_pieces": int(min(pieces)),
            "one_piece_batches": round(sum(p == 1 for p in pieces) / len(pieces), 4),
            "batch_label_skew": round(float(np.mean(np.abs(shares - 0.5))), 4),
            "batch_autocorrelation": round(auto, 4)}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [args.rows] * (args.pieces - 1) + [max(1, args.samples - args.rows * (args.pieces - 1))]
    samples = sum(rows)
    piece_of = np.repeat(np.arange(len(rows)), rows)
    label_of = (np.arange(samples) >= samples // 2).astype(int)
    out = []
    for epoch in range(args.epochs):
        for name, lanes in (("lanes (default)", default_lanes(args.global_batch)), ("one lane", 1)):
            order = EpochOrder(rows, global_batch=args.global_batch, lanes=lanes, seed=0, epoch=epoch,
                               shuffle=True, shuffle_buffer=args.shuffle_buffer, drop_last=True)
            batches = [order.sample_positions(k) for k in range(order.batches)]
            out.append({"order": name, "lanes": lanes, "epoch": epoch, **metrics(batches, piece_of, label_of)})
        perm = np.random.default_rng((0, epoch)).permutation(samples)
        batches = [perm[k * args.global_batch:(k + 1) * args.global_batch] for k in range(samples // args.global_batch)]
        out.append({"order": "full permutation", "lanes": None, "epoch": epoch,
                    **metrics(batches, piece_of, label_of)})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rows", type=int, default=88, help="rows per piece (32 MB row groups of 360 KB volumes)")
    parser.add_argument("--pieces", type=int, default=23)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--shuffle-buffer", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=3)
    for rec in run(parser.parse_args(argv)):
        print(json.dumps(rec))


if __name__ == "__main__":
    main()
