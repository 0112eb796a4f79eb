"""The projection model's inputs, read from recorded cells (results.jsonl): what a store costs
per sample, what computes a step, the loader and the storage a cell ran with."""
from __future__ import annotations

from trainfeed.benchmarks.model.profiles import ObjectStore, load_object_store
from trainfeed.benchmarks.model.projection import Device, Layout, Loader, Machine
from trainfeed.benchmarks.records import Record
from trainfeed.converters.storage.fetch import PART_SIZE

#: The CPU stages of an image input pipeline a cell records per sample (benchmarks/ab/stages.py).
STAGES = ("read", "decode", "augment")


def layout_of(cell: Record) -> Layout:
    """Per-sample read cost of the cell's store: host CPU-seconds from the ingest-only pass's
    process CPU time; bytes and bytes per request from the storage's request counters over the
    same pass when the emulation counted them, else from the layout (one request per small
    file, 8 MB parts)."""
    ingest = cell["ingest_only"]
    requests = ingest.get("requests") or {}
    samples = ingest.get("samples") or 0
    if requests.get("gets") and samples:
        nbytes = requests["bytes"] / samples
        request_bytes = requests["bytes"] / requests["gets"]
        how = "measured"
    else:
        nbytes = float(cell["sample_bytes"])
        request_bytes = nbytes if cell["store"] == "blob" else float(PART_SIZE)
        how = "bytes from the sample size (no request counters)"
    return Layout(cell["store"], ingest.get("cpu_s_per_sample") or 0.0, nbytes, max(1.0, request_bytes), how,
                  min(data_bytes_per_sample(cell), nbytes))


def data_bytes_per_sample(cell: Record) -> float:
    """The bytes of one sample's data as the cell's store holds it: an image store's, measured
    over its first pieces when it was staged (encoded bytes, or pixels); else the array's.

    A store's size projected to more samples is this per sample (at most the bytes the
    ingest-only pass moved per sample: a compressed store holds fewer), never the bytes the pass
    moved over the samples it counted: those hold the store's fixed overhead (metadata, HDF5
    chunk and heap overhead, manifests, a partly filled last chunk) and the samples of a last
    partial batch read but not counted. For a store of a few hundred samples that is a large
    share, which multiplied to millions projected HDF5 at 6.3 GiB where the same samples took
    2.6 GiB as small files (issue #32)."""
    stages = cell.get("stages")
    return float(stages["stored_bytes_per_sample"] if stages else cell["sample_bytes"])


def device_of(cell: Record) -> Device:
    """What computed the cell's step: an emulated or real GPU (seconds per step; a real one's
    host CPU per step from compute-only's process CPU time), or this machine's CPU (CPU-seconds
    per step)."""
    co = cell["compute_only"]
    if cell["node"] == "cpu":
        return Device("cpu", 0, co.get("cpu_s_per_step") or co["step_s"] * cell["env"]["cores"], co["how"])
    host = co.get("cpu_s_per_step") if cell.get("node_kind") == "real" else None
    return Device(cell["node"], 1, co["step_s"], co["how"], host or 0.0)


def loader_of(cell: Record) -> Loader:
    """trainfeed's reader as the cell ran it."""
    conn = cell["connections"]
    return Loader("trainfeed", conn["io_concurrency"] or conn["reader_workers"], conn["reader_workers"], True,
                  cell["framework"])


def storage_of(cell: Record) -> ObjectStore | None:
    """The latency profile every read of the cell went through; None when it read storage as it
    is (local disk, or a real endpoint whose latency is whatever it was)."""
    st = cell["storage"]
    if st.get("profile_figures"):
        return ObjectStore(**st["profile_figures"])
    return load_object_store(st["profile"]) if st.get("profile") else None


def machine_of(cell: Record) -> Machine:
    """The machine the cell ran on: this machine's vCPUs and the cell's device."""
    return Machine("this machine", cell["env"]["cores"], device_of(cell))
