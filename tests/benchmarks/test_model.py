"""`model.project` on hand-worked cases, and `parse_loader`: every rate below is worked out in
the comment beside it."""
from __future__ import annotations

import pytest

from trainfeed.benchmarks.model import Device, Layout, Loader, Machine, parse_loader, project
from trainfeed.benchmarks.profiles import ObjectStore
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
    the latency penalty does not vanish on a bigger instance."""
    small = project(machine(4), SMALL_FILES, ONE_AT_A_TIME, BLOB, 32)
    big = project(machine(64), SMALL_FILES, ONE_AT_A_TIME, BLOB, 32)
    assert small == big


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
