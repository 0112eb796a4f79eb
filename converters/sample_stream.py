"""A conversion's source as the writer pulls it: validated samples in batches, the rejects
collected (or the first one raised), the bytes and files counted for the summary."""
from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from trainfeed.converters.errors import SampleError, TrainfeedError
from trainfeed.converters.layout import DatasetSchema
from trainfeed.converters.redact import redact_url
from trainfeed.converters.sources.decode import Sample
from trainfeed.converters.sources.labels import Labels
from trainfeed.converters.sources.listing import Listing
from trainfeed.converters.sources.samples import SchemaGuard, load_sample, ordered_map

if TYPE_CHECKING:
    import fsspec

    from trainfeed.converters.convert import ConvertConfig

ProgressFn = Callable[[int, int], None]  # (files done, bytes read so far)


class SampleStream:
    """Validated samples in batches; collects rejects and counts bytes as the writer pulls."""

    def __init__(self, cfg: ConvertConfig, fs: fsspec.AbstractFileSystem, listing: Listing, labels: Labels,
                 progress: ProgressFn | None, check_interrupt: Callable[[], None],
                 existing_ids: set[str] | None = None) -> None:
        self.cfg, self.fs, self.listing, self.labels = cfg, fs, listing, labels
        self.progress = progress
        self.check_interrupt = check_interrupt
        self.existing_ids = existing_ids or set()
        self.guard = SchemaGuard(listing.kind, cfg.image, arrays=cfg.arrays)
        self.rejects: list[dict[str, str]] = []  # file, id, reason
        self.accepted: list[str] = []
        self.files_done = self.bytes_in = self.payload_bytes = self.depth_changed = 0
        self._samples = self._validated()

    def _reject(self, err: SampleError, sample_id: str) -> None:
        if self.cfg.on_error == "fail":
            raise err
        self.rejects.append({"file": err.path, "id": sample_id, "reason": err.reason})

    def _validated(self) -> Iterator[Sample]:
        files = self.listing.files
        load = lambda src: load_sample(self.fs, self.listing.kind, src, self.labels, self.cfg.image)  # noqa: E731
        for src, result in zip(files, ordered_map(load, files, self.cfg.workers)):
            self.check_interrupt()
            self.files_done += 1
            if isinstance(result, Sample):
                self.bytes_in += result.nbytes_in
                try:
                    if result.id in self.existing_ids:
                        raise SampleError(src.path, f"id {result.id!r} is already in the Delta table")
                    result = self.guard.take(src.path, result)
                except SampleError as err:
                    self._reject(err, src.id)
                else:
                    self.accepted.append(result.id)
                    self.payload_bytes += result.nbytes
                    self.depth_changed += result.depth_changed
                    yield result
            elif isinstance(result, SampleError):
                self._reject(result, src.id)
            elif isinstance(result, OSError):  # a source problem, never to be taken for DST's
                raise TrainfeedError(f"{src.path}: cannot read: {result}") from result
            else:
                raise result
            if self.progress:
                self.progress(self.files_done, self.bytes_in)

    def first(self) -> Sample:
        for sample in self._samples:
            return sample
        reasons = "; ".join(f"{r['file']}: {r['reason']}" for r in self.rejects[:3])
        raise TrainfeedError(f"{self.cfg.src}: no valid samples ({len(self.rejects)} rejected: {reasons})")

    def batches(self, first: Sample, rows: int) -> Iterator[list[Sample]]:
        batch = [first]
        for sample in self._samples:
            if len(batch) >= rows:
                yield batch
                batch = []
            batch.append(sample)
        if batch:
            yield batch

    def schema(self, labels: Labels) -> DatasetSchema:
        assert self.guard.specs is not None, "schema() follows first()"
        return DatasetSchema(fields=list(self.guard.specs), labeled=labels.by_id is not None,
                             label_map=labels.label_map, source=source_location(self.cfg.src))


def source_location(url: str) -> str:
    """Where a store's samples came from, as recorded in the store: an absolute local path, or
    the URL without its query string (SAS tokens) and user info."""
    return os.path.abspath(url) if "://" not in url else redact_url(url)
