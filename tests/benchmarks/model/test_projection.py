"""`model.project` on hand-worked cases, and `parse_loader`: every rate below is worked out in
the comment beside it."""
from __future__ import annotations

import pytest

from trainfeed.benchmarks.model.profiles import IO_CPU_S_PER_GB, ObjectStore
from trainfeed.benchmarks.model.projection import Device, Layout, Loader, Machine, feed, host_cpu, parse_loader, project
from trainfeed.converters.errors import UsageError

# 50 ms first byte, 60 MB/s a stream, 64 connections at most
BLOB = ObjectStore("blob", 50.0, 60.0, 64, "test")
# 360 KB files, one GET each: 50 ms + 360,000 / 60e6 s = 56 ms a request; 0.5 ms CPU a sample
SMALL_FILES = Layout("blob", 0.0005, 360_000, 360_000)
# the same bytes in 8 MB parts: 50 ms + 133.33 ms = 183.33 ms a part, 0.045 parts a sample
COMPACTED = Layout("delta", 0.0002, 360_000, 8_000_000)
T4 = Device("t4", 1, 0.38, "estimate")  # 0.38 s a step of 32: 84.2 samples/s
ONE_AT_A_TIME = Loader("generator", 1, 1, False)
PETASTORM = Loader("petastorm", 10, 10, True)


def machine(vcpus: int, device: Device = T4, network_gbps: float | None = None) -> Machine:
    return Machine(f"{vcpus} vCPUs", vcpus, device, network_gbps)


def test_synchronous_loader_adds_reading_to_compute():
    # no prefetch, one thread: per sample 0.38 / 32 + 0.0005 + 0.056 = 0.0683750 s
    p = project(machine(4), SMALL_FILES, ONE_AT_A_TIME, BLOB, 32)
    assert p.samples_per_s == pytest.approx(1 / (0.38 / 32 + 0.0005 + 0.056))
    assert p.serial and p.bottleneck == "io-latency"
    assert p.limits["io-latency"] == pytest.approx(1 / 0.056)


def test_prefetch_runs_at_the_binding_resource():
    # 10 in flight: 0.1833 x 0.045 / 10 = 0.000825 s a sample (1,212/s); the T4 takes 84.2/s: compute binds
    p = project(machine(4), COMPACTED, PETASTORM, BLOB, 32)
    assert p.samples_per_s == pytest.approx(32 / 0.38)
    assert p.bottleneck == "compute"
    assert p.limits["bandwidth"] == pytest.approx(1 / ((0.05 + 8 / 60) * 0.045 / 10))


def test_request_concurrency_does_not_grow_with_vcpus():
    """The blob row of a 4-vCPU and a 64-vCPU T4 instance read with the same loader are the same:
    the latency penalty does not vanish on a bigger instance. Only what the storage client's CPU
    alone sustains grows with the vCPUs (16x)."""
    small = project(machine(4), SMALL_FILES, ONE_AT_A_TIME, BLOB, 32)
    big = project(machine(64), SMALL_FILES, ONE_AT_A_TIME, BLOB, 32)
    small_io_cpu, big_io_cpu = small.limits.pop("io-cpu"), big.limits.pop("io-cpu")
    assert small == big
    assert big_io_cpu == pytest.approx(16 * small_io_cpu)


def test_threads_are_capped_by_vcpus():
    # 0.5 ms a sample on min(10 threads, 2 vCPUs): 4,000/s; on 16 vCPUs 10 threads: 20,000/s
    layout = Layout("blob", 0.0005, 360_000, 360_000)
    fast_device = Device("h100", 1, 0.001, "estimate")
    assert project(machine(2, fast_device), layout, PETASTORM, None, 32).limits["decode"] == pytest.approx(4000)
    assert project(machine(16, fast_device), layout, PETASTORM, None, 32).limits["decode"] == pytest.approx(20000)


def test_cpu_node_shares_its_vcpus_between_step_and_reader():
    # a step costs 46 CPU-s for 32 samples (1.4375 s a sample), the reader 0.5 ms: on 16 vCPUs
    # (1.4375 + 0.0005) / 16 = 0.0898750 s a sample
    cpu = Device("cpu", 0, 46.0, "measured")
    p = project(machine(16, cpu), SMALL_FILES, PETASTORM, None, 32)
    assert p.samples_per_s == pytest.approx(16 / (46 / 32 + 0.0005))
    assert p.bottleneck == "compute"


def test_cpu_node_without_prefetch_waits_for_each_file():
    # 46 / 32 / 16 = 0.0898438 s compute + 0.0005 s CPU + 0.056 s waiting on the GET
    cpu = Device("cpu", 0, 46.0, "measured")
    p = project(machine(16, cpu), SMALL_FILES, ONE_AT_A_TIME, BLOB, 32)
    assert p.samples_per_s == pytest.approx(1 / (46 / 32 / 16 + 0.0005 + 0.056))


def test_network_binds_a_fast_device():
    # 1 Gbit/s moves 125 MB/s: 347.2 samples/s of 360 KB; the H100 takes 32,000/s
    fast = Device("h100", 1, 0.001, "estimate")
    p = project(machine(96, fast, network_gbps=1.0), COMPACTED, PETASTORM, None, 32)
    assert p.bottleneck == "network"
    assert p.samples_per_s == pytest.approx(125e6 / 360_000)


def test_several_gpus_share_the_batch():
    # 4 T4s: 4 x 84.2 = 336.8/s
    p = project(machine(48, Device("t4", 4, 0.38, "estimate")), COMPACTED, PETASTORM, None, 32)
    assert p.samples_per_s == pytest.approx(4 * 32 / 0.38)


@pytest.mark.parametrize("text,expected", [
    ("concurrency=1,prefetch=off,framework=tf", Loader("your loader", 1, 1, False, "tf", "--baseline-loader")),
    ("name=keras,concurrency=16", Loader("keras", 16, 16, True, "torch", "--baseline-loader")),
    ("threads=4", Loader("your loader", 4, 4, True, "torch", "--baseline-loader")),
    ("concurrency=8,threads=2,prefetch=on", Loader("your loader", 8, 2, True, "torch", "--baseline-loader")),
])
def test_parse_loader(text, expected):
    assert parse_loader(text) == expected


@pytest.mark.parametrize("text,message", [
    ("concurrency=0", "concurrency must be a whole number >= 1, got '0'"),
    ("prefetch=maybe", "prefetch is on or off, got 'maybe'"),
    ("workers=4", "unknown key 'workers'"),
    ("concurrency", "'concurrency' is not KEY=VALUE"),
])
def test_parse_loader_refuses(text, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_loader(text)


# ------------------------------------------------------------------ the storage client's CPU

# An H100-like GPU: 32 samples in 2.4615 ms, 13,000 samples/s. 360 KB a sample in 8 MB parts, 0.04 ms
# of decode CPU. A nearby store (1 ms, 500 MB/s a stream, 256 in flight) whose client costs 3 CPU-s per GB:
# 360,000 B x 3e-9 = 1.08 ms of I/O CPU a sample. 32 in flight: (1 ms + 16 ms) x 0.045 parts / 32 =
# 0.0239 ms a sample (41,830/s): the requests never bind.
H100 = Device("h100", 1, 32 / 13_000, "estimate")
PARTS = Layout("delta", 0.00004, 360_000, 8_000_000)
NEAR = ObjectStore("near", 1.0, 500.0, 256, "test", io_cpu_s_per_gb={"1": 3.0, "8": 3.0, "32": 3.0})
WIDE = Loader("trainfeed", 32, 16, True)


def test_io_cpu_is_bytes_times_cpu_per_gb():
    assert host_cpu(H100, PARTS, WIDE, NEAR, 32) == {"compute": 0.0, "decode": pytest.approx(0.00004),
                                                     "io-cpu": pytest.approx(0.00108)}
    # local disk: the reader's measured CPU holds its reads, no client apart
    assert host_cpu(H100, PARTS, WIDE, None, 32)["io-cpu"] == 0.0
    # a CPU node's framework is its whole step: 46 CPU-s for 32 samples
    assert host_cpu(Device("cpu", 0, 46.0, "measured"), PARTS, WIDE, None, 32)["compute"] == pytest.approx(46 / 32)


def test_io_cpu_binds_when_the_vcpus_cannot_carry_it():
    # 12 vCPUs for 1.08 + 0.04 ms a sample: 12 / 0.00112 = 10,714/s, under the GPU's 13,000
    p = project(machine(12, H100), PARTS, WIDE, NEAR, 32)
    assert p.bottleneck == "io-cpu"
    assert p.samples_per_s == pytest.approx(12 / 0.00112)
    assert p.limits["io-cpu"] == pytest.approx(12 / 0.00108)  # the client's CPU alone on every vCPU
    assert p.limits["compute"] == pytest.approx(13_000)


def test_io_cpu_does_not_bind_when_the_vcpus_suffice():
    # 16 vCPUs: 16 / 0.00112 = 14,286/s, over the GPU's 13,000: compute binds
    p = project(machine(16, H100), PARTS, WIDE, NEAR, 32)
    assert (p.bottleneck, p.samples_per_s) == ("compute", pytest.approx(13_000))


def test_the_vcpus_bind_but_decode_is_their_largest_consumer():
    # 2 ms of decode + 1.08 ms of I/O on 12 vCPUs: 3,896/s; decode alone on 12 threads 6,000/s, so the
    # shared vCPUs bind, and decode takes the larger share: the bottleneck is decode, not io-cpu
    heavy = Layout("delta", 0.002, 360_000, 8_000_000)
    p = project(machine(12, H100), heavy, WIDE, NEAR, 32)
    assert (p.bottleneck, p.samples_per_s) == ("decode", pytest.approx(12 / 0.00308))
    assert p.limits["decode"] == pytest.approx(6000)


def test_the_vcpus_to_feed_one_gpu():
    # 13,000 samples/s x 360 KB = 4.68 GB/s; x 3 CPU-s/GB = 14.04 vCPUs of I/O, x 0.04 ms = 0.52 of decode
    f = feed(H100, PARTS, WIDE, NEAR, 32)
    assert (f.samples_per_s, f.gb_per_s) == (pytest.approx(13_000), pytest.approx(4.68))
    assert (f.io, f.decode, f.framework, f.vcpus) == (pytest.approx(14.04), pytest.approx(0.52), 0.0, 15)
    assert f.describe() == "15 vCPUs (I/O 14.0, decode 0.5, framework 0.0)"
    # the native client's default figure (0.8 CPU-s/GB): 4.68 x 0.8 = 3.74 vCPUs of I/O
    default = feed(H100, PARTS, WIDE, ObjectStore("near", 1.0, 500.0, 256, "test"), 32)
    assert default.io == pytest.approx(4.68 * IO_CPU_S_PER_GB["32"]) and default.vcpus == 5
    # a real GPU's measured host work: 2 ms of CPU per 2.46 ms step is 0.8125 vCPUs
    real = feed(Device("cuda", 1, 32 / 13_000, "measured", host_cpu_s=0.002), PARTS, WIDE, NEAR, 32)
    assert real.framework == pytest.approx(0.8125) and real.vcpus == 16


def test_cpu_per_gb_follows_the_requests_in_flight():
    # probed 2.0 / 1.0 / 0.5 CPU-s per GB at 1 / 8 / 32: linear in log2 between, the end figure beyond
    store = ObjectStore("s", 1.0, 500.0, 256, "test", io_cpu_s_per_gb={"1": 2.0, "8": 1.0, "32": 0.5})
    got = [store.io_cpu_at(n) for n in (1, 4, 8, 16, 32, 64)]
    assert got == pytest.approx([2.0, 2.0 - 2 / 3, 1.0, 0.75, 0.5, 0.5])
    # the figure at the loader's requests in flight: 4 for a loader of 4; 8 for a loader of 32 on a store
    # that allows 8
    p4 = host_cpu(H100, PARTS, Loader("four", 4, 4, True), store, 32)["io-cpu"]
    assert p4 == pytest.approx(360_000e-9 * (2.0 - 2 / 3))
    capped = ObjectStore("s", 1.0, 500.0, 8, "test", io_cpu_s_per_gb={"1": 2.0, "8": 1.0, "32": 0.5})
    assert host_cpu(H100, PARTS, WIDE, capped, 32)["io-cpu"] == pytest.approx(360_000e-9 * 1.0)
