"""`storage-bench run` on a JPEG folder: the small files, the compacted store with encoded
images and the one with decoded pixels, read the same samples; each stage's CPU cost is
measured; the verdict names the stage that binds (table-driven below, from recorded cells)."""
from __future__ import annotations

import csv

import pytest

from tests.benchmarks.recorded import cell
from trainfeed.benchmarks.ab.measure import id_label_digest
from trainfeed.benchmarks.model.measured import layout_of, loader_of, machine_of, storage_of
from trainfeed.benchmarks.model.projection import project
from trainfeed.benchmarks.model.verdict import BELOW_MODEL, verdict

from .test_storage_bench import bench_cli, records_of

COUNT = 48


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("image-ab")
    res = bench_cli("generate", "images", root / "jpegs", "--count", str(COUNT), "--shape", "480x640", "--seed", "5")
    assert res.exit_code == 0, res.stderr
    res = bench_cli("run", root / "jpegs", "--out", root / "out", "--stores", "blob,parquet", "--nodes", "cpu,h100",
                    "--resize", "32x32", "--width", "8", "--batch-size", "16", "--steps", "3", "--cpu-steps", "2",
                    "--workers", "2", "--storage-profile", "none")
    assert res.exit_code == 0, res.stderr
    return root / "jpegs", root / "out"


def test_three_image_variants_read_the_source(image_run):
    src, out = image_run
    expected = id_label_digest((f"{p.parent.name}/{p.stem}", int(p.parent.name.split("_")[1]))
                               for p in src.glob("class_*/*.jpg"))
    cells = [c for c in records_of(out) if c["kind"] == "cell"]
    assert {(c["store"], c["image_storage"]) for c in cells} == {
        ("blob", "encoded"), ("parquet-encoded", "encoded"), ("parquet-decoded", "decoded")}
    assert len(cells) == 6  # 3 stores x 2 nodes, none failed
    for c in cells:
        assert c["sample_shape"] == [32, 32, 3] and c["sample_bytes"] == 32 * 32 * 3, c["store"]
        assert (c["ingest_only"]["samples"], c["ingest_only"]["ids_labels_sha256"]) == (COUNT, expected), c["store"]
        if c["node_kind"] == "emulated":
            assert (c["real"]["samples_read"], c["real"]["ids_labels_sha256"]) == (COUNT, expected), c["store"]


def test_stage_costs_are_measured(image_run):
    _, out = image_run
    for c in (c for c in records_of(out) if c["kind"] == "cell"):
        st = c["stages"]
        assert st["samples"] == COUNT, c["store"]
        assert st["read"] > 0 and st["augment"] > 0, (c["store"], st)
        if c["image_storage"] == "encoded":
            assert st["decode"] > 0 and st["stored_bytes_per_sample"] > 0, (c["store"], st)
            # JPEGs re-encoded at 32x32 are smaller than their pixels; the 480x640 originals are not
            assert (st["stored_bytes_per_sample"] < 3072) == (c["store"] == "parquet-encoded"), (c["store"], st)
        else:
            assert st["decode"] == 0 and st["stored_bytes_per_sample"] == st["pixel_bytes_per_sample"] == 3072, st


def test_each_cell_has_the_verdict_of_its_recorded_figures(image_run):
    """The verdict each cell records is the one the verdict function gives for the figures it
    recorded, on an idle machine or a busy one. What the model makes of those figures does not
    depend on the machine's load (CPU time per image, not a wall rate): 480x640 JPEGs decoded and
    resized as read cost milliseconds of CPU each, which 2 threads cannot turn into the 4,000
    images/s of an emulated H100 (its per-step floor), so the small files are decode-bound; the
    store of decoded 32x32 pixels costs a fraction of that, so the device sets the pace (on an idle
    machine; a busy one can leave it just short: the CPU time per image is inflated too). Whether
    the real run then kept up ("compute") or other processes held it below the model
    ("contention") depends on what else ran: either is right, for the rate the run measured.
    Both verdicts are pinned on constructed cells below (ROWS: "... on an H100")."""
    _, out = image_run
    cells = {(c["store"], c["node"]): c for c in records_of(out) if c["kind"] == "cell"}
    for key, c in cells.items():
        assert c["verdict"] == verdict(c), key
    v = cells[("blob", "h100")]["verdict"]
    assert v["bottleneck"] == "decode", v
    assert v["advice"].startswith("decode-bound: ") and "store decoded pixels" in v["advice"], v
    decoded, blob = cells[("parquet-decoded", "h100")], cells[("blob", "h100")]
    proj, blob_proj = (project(machine_of(c), layout_of(c), loader_of(c), storage_of(c), c["batch_size"])
                       for c in (decoded, blob))
    # decoded pixels cost a fraction of the JPEGs' CPU per image, measured in the same run (a busy
    # machine inflates both); whether that clears the H100's 4,000/s depends on the load
    assert proj.samples_per_s > 3 * blob_proj.samples_per_s, (proj, blob_proj)
    if proj.bottleneck == "compute":
        reached = decoded["real"]["samples_per_s"] >= BELOW_MODEL * proj.samples_per_s
        assert decoded["verdict"]["bottleneck"] == ("compute" if reached else "contention"), (proj, decoded["real"])
    report = (out / "report.md").read_text()
    assert "parquet-encoded" in report and "parquet-decoded" in report and "decode-bound" in report


def test_results_csv_holds_the_stage_costs(image_run):
    _, out = image_run
    cells = {(c["store"], c["node"]): c for c in records_of(out) if c["kind"] == "cell"}
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == len(cells) == 6
    for row in rows:
        c = cells[(row["store"], row["node"])]
        assert row["image_storage"] == c["image_storage"]
        assert [float(row[f"{s}_cpu_ms"]) for s in ("read", "decode", "augment")] == pytest.approx(
            [c["stages"][s] * 1e3 for s in ("read", "decode", "augment")])


def stages(read=0.0001, decode=0.0, augment=0.0001, stored=1000.0, pixels=12288) -> dict:
    return {"read": read, "decode": decode, "augment": augment, "samples": 64, "stored_bytes_per_sample": stored,
            "pixel_bytes_per_sample": pixels}


COSTS = "(CPU per sample: read {}, decode+resize {}, augment {})"
H100_JPEGS = stages(read=0.0003, decode=0.0028, augment=0.0001, stored=30720, pixels=3072)
H100_PIXELS = {"compute": 4000, "cpu_ms": 0.15, "workers": 2, "cores": 2,
               "stages": stages(read=0.0001, augment=0.00005, stored=3072, pixels=3072)}
ROWS = [
    # id, the cell, expected bottleneck, expected advice; the reader's CPU per sample (cpu_ms) is the stages' sum
    # 4 threads / 2.5 ms = 1,600/s for a device that takes 10,000: ceil(10,000 x 2.5 ms) = 25 vCPUs
    ("decode costs most", cell(compute=10_000, cpu_ms=2.5, real=1600, workers=4, cores=8,
                               stages=stages(read=0.0001, decode=0.002, augment=0.0004)), "decode",
     "decode-bound: 2.000 ms CPU per image to decode and resize "
     + COSTS.format("0.100 ms", "2.000 ms", "0.400 ms")
     + "; the reader delivers 1,600 images/s, the device takes 10,000 and needs ~25 vCPUs at this rate; store "
       "decoded pixels (12.3x the bytes) or add CPUs"),
    ("augment costs most", cell(compute=10_000, cpu_ms=1.0, real=4000, workers=4, cores=8,
                                stages=stages(read=0.0001, decode=0.0, augment=0.0009, stored=12288)), "augment",
     "augmentation-bound: 0.900 ms CPU per image to crop, resize and flip "
     + COSTS.format("0.100 ms", "0.000 ms", "0.900 ms")
     + "; the reader delivers 4,000 images/s, the device takes 10,000 and needs ~10 vCPUs at this rate; augment on "
       "the GPU or add CPUs"),
    # the reader's CPU allows 4 / 2 ms = 2,000/s; 4 KB GETs at 20 ms, 8 in flight, 399/s: storage binds
    ("CPU to spare: waits on storage", cell("blob", compute=1000, cpu_ms=2.0, real=398, workers=4, cores=8,
                                            profile="azure-blob",
                                            stages=stages(read=0.0001, decode=0.0015, augment=0.0004)), "io-latency",
     "storage latency: 4 KB requests at 20 ms first byte, 8 in flight -> 399 samples/s, the device takes 1,000; "
     "repack into files of ~128 MB (convert --to delta) or allow more requests in flight (--io-concurrency)"),
    # 8 threads on 2 vCPUs: 2 / 2 ms = 1,000/s
    ("threads are capped by cores", cell("blob", compute=1500, cpu_ms=2.0, real=1000, workers=8, cores=2,
                                         stages=stages(read=0.0001, decode=0.0015, augment=0.0004)), "decode",
     "decode-bound: 1.500 ms CPU per image to decode and resize " + COSTS.format("0.100 ms", "1.500 ms", "0.400 ms")
     + "; the reader delivers 1,000 images/s, the device takes 1,500 and needs ~3 vCPUs at this rate; store decoded "
       "pixels (12.3x the bytes) or add CPUs"),
    ("reading costs most", cell(compute=100_000, cpu_ms=4.1, real=975, workers=4, cores=8,
                                stages=stages(read=0.003, decode=0.001, augment=0.0001)), "decode",
     "read-bound: 3.000 ms CPU per image to read and parse its bytes "
     + COSTS.format("3.000 ms", "1.000 ms", "0.100 ms")
     + "; the reader delivers 976 images/s, the device takes 100,000 and needs ~410 vCPUs at this rate; repack into "
       "files of ~128 MB (fewer, larger reads) or add CPUs"),
    ("an image cell that keeps up is compute-bound", cell(compute=1000, cpu_ms=0.5, real=950,
                                                          stages=stages(decode=0.002)), "compute",
     "compute-bound: the accelerator sets the pace (1,000 samples/s; reading alone could deliver 8,000). A faster "
     "device or more devices help; repacking does not."),
    # the end-to-end run above, with figures of its kind: an emulated H100 takes 4,000 images/s (its per-step floor),
    # 2 threads on 2 vCPUs read. The 480x640 JPEGs: 2 / 3.2 ms = 625/s; ceil(4,000 x 3.2 ms) = 13 vCPUs; their
    # pixels at 32x32 are a tenth of the bytes
    ("480x640 JPEGs on an H100", cell("blob", node="h100", compute=4000, cpu_ms=3.2, real=610, workers=2, cores=2,
                                      stages=H100_JPEGS), "decode",
     "decode-bound: 2.800 ms CPU per image to decode and resize " + COSTS.format("0.300 ms", "2.800 ms", "0.100 ms")
     + "; the reader delivers 625 images/s, the device takes 4,000 and needs ~13 vCPUs at this rate; store decoded "
       "pixels (0.1x the bytes) or add CPUs"),
    # their decoded pixels: 2 / 0.15 ms = 13,333/s, the device binds; the real run reached 3,880 (>= 80% of 4,000)
    ("decoded pixels on an H100, idle machine", cell("parquet-decoded", node="h100", real=3880, **H100_PIXELS),
     "compute", "compute-bound: the accelerator sets the pace (4,000 samples/s; reading alone could deliver 13,333). "
     "A faster device or more devices help; repacking does not."),
    # the same cell beside other processes: 2,680 is under 80% of the 4,000 the model allows
    ("decoded pixels on an H100, busy machine",
     cell("parquet-decoded", node="h100", real=2680, contended=["other processes used 82% of the machine's CPU time"],
          **H100_PIXELS), "contention",
     "the real run reached 2,680 samples/s where its parts allow 4,000 (compute-bound): the reader and the step "
     "compete for 2 vCPUs (other processes used 82% of the machine's CPU time); give the input pipeline its own "
     "cores, or rerun on an idle machine"),
]


@pytest.mark.parametrize("rec,bottleneck,advice", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_image_verdict(rec, bottleneck, advice):
    assert verdict(rec) == {"bottleneck": bottleneck, "advice": advice}


@pytest.mark.parametrize("args,message", [
    (["--resize", "32x32"], "--resize: {src} holds no JPEG/PNG images"),
    (["--image-storage", "png"], "unknown --image-storage 'png': choose from encoded, decoded"),
    (["--resize", "32"], "--resize expects HEIGHTxWIDTH such as 64x64, got '32'"),
])
def test_image_options_refused_with_a_clear_error(tmp_path, args, message):
    src = tmp_path / "vols"
    assert bench_cli("generate", "volumes", src, "--count", "8", "--shape", "4x4x2x1").exit_code == 0
    res = bench_cli("run", src, "--out", tmp_path / "out", "--stores", "blob", "--nodes", "t4", *args)
    assert res.exit_code == 2, res.stderr
    assert res.stderr.strip().splitlines()[-1] == f"error: {message.format(src=src)}"


def test_missing_source_is_refused_before_anything_runs(tmp_path):
    """A mistyped SRC fails at once, in the user's words (no store is tried, no internal URL shown)."""
    res = bench_cli("run", tmp_path / "nope", "--out", tmp_path / "out", "--stores", "blob,parquet", "--nodes", "t4")
    assert res.exit_code == 2
    assert res.stderr == f"error: {tmp_path / 'nope'}: source folder not found\n"
    assert not (tmp_path / "out").exists()


def test_images_of_different_sizes_are_refused_before_staging_naming_resize(tmp_path):
    """`storage-bench run` resizes with --resize (it has no --image-size): images of two sizes
    are refused before any store is converted, naming both files and that option."""
    from tests.conftest import write_images

    write_images(tmp_path / "imgs", 4, size=(24, 32))
    write_images(tmp_path / "other", 2, size=(20, 20))
    odd = tmp_path / "imgs" / "b" / "odd.jpg"
    (tmp_path / "other" / "a" / "img000.jpg").rename(odd)
    res = bench_cli("run", tmp_path / "imgs", "--out", tmp_path / "out", "--stores", "blob,parquet", "--nodes", "t4")
    assert res.exit_code == 2
    assert res.stderr == (f"error: {odd} is 20x20 (HxW) but {tmp_path / 'imgs' / 'a' / 'img000.jpg'} is 24x32: the "
                          "images differ in size; pass --resize HxW (e.g. --resize 64x64) to resize every image to "
                          "one size\n")
    assert not (tmp_path / "out").exists()
