"""The report built from recorded results: store order and colours from the format registry (a
store it does not know still shows, in a colour of its own), one utilization panel per cell with
a time axis, Markdown rendered safely, and a page that needs no network."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser

from tests.benchmarks.recorded import cell, error, location
from trainfeed.benchmarks.report import charts, report
from trainfeed.converters.formats.registry import FORMATS

TIMELINE = [{"t": 0.0, "cpu_percent": 10.0, "process_cpu_percent": 40.0},
            {"t": 1.0, "cpu_percent": 90.0, "process_cpu_percent": 300.0}]


class Tables(HTMLParser):
    """The text of every table cell of a page: tables -> rows -> cells."""

    def __init__(self, page: str):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.in_cell = False
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self.tables[-1][-1].append("")
            self.in_cell = True

    def handle_endtag(self, tag):
        self.in_cell = self.in_cell and tag not in ("td", "th")

    def handle_data(self, data):
        if self.in_cell:
            self.tables[-1][-1][-1] += data


def write_results(out, records) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_store_order_is_blob_then_the_registry_then_the_unknown():
    assert charts.store_order(["zarr", *reversed(list(FORMATS)), "blob", "lance", "zarr"]) == \
        [*list(dict.fromkeys(["blob", *FORMATS])), "zarr", "lance"]


def test_store_colors_known_and_spare():
    assert charts.store_colors(["blob", "parquet", "zarr", "lance"]) == {
        "blob": charts.COLORS["blob"], "parquet": charts.COLORS["parquet"], "zarr": charts.SPARE[0],
        "lance": charts.SPARE[1]}
    many = [f"fmt{i}" for i in range(2 * len(charts.SPARE) + 1)]
    assert list(charts.store_colors(many).values()) == [*charts.SPARE, *charts.SPARE, charts.SPARE[0]]


def test_report_of_recorded_cells(tmp_path):
    nodes = ("cpu", "t4")
    stores = ["hdf5", "zarr", "parquet", "blob"]  # zarr: a format this registry does not know
    records = [cell(s, n, node_kind="real" if n == "cpu" else "emulated", timeline=TIMELINE, real=100.0 * (i + 1))
               for i, s in enumerate(stores) for n in nodes if (s, n) != ("zarr", "t4")]
    records.append(error("zarr", "t4", "reader <script>alert(1)</script> failed | *twice*"))
    write_results(tmp_path, records)
    info = report.build(str(tmp_path), target_samples=1000, target_epochs=1)
    assert (info["cells"], info["errors"], info["failed_cells"]) == (7, 1, 1)

    md = (tmp_path / "report.md").read_text()
    assert "| node | blob, trainfeed | parquet | hdf5 | zarr |" in md
    page = (tmp_path / "report.html").read_text()
    tables = Tables(page).tables
    assert tables[0][0] == ["node", "blob, trainfeed", "parquet", "hdf5", "zarr"]
    assert [row[0] for row in tables[0][1:]] == ["cpu: this machine (4 vCPUs)",
                                                 "t4 (estimate) on this machine (4 vCPUs)"]
    assert tables[0][2][4] == "-"  # zarr x t4 failed: not projected onto t4
    # the failure is shown as text; the escaped pipe stays inside its cell
    assert tables[-1][1:] == [["zarr", "t4", "torch", "0", "cell", "reader <script>alert(1)</script> failed | twice"]]
    assert "&lt;script&gt;" in page and "<script" not in page

    svgs = re.findall(r"<svg .*?</svg>", page, re.S)
    assert [re.search(r'aria-label="([^"]+)"', s).group(1) for s in svgs] == [
        "throughput torch", "stall breakdown torch", "utilization torch"]
    throughput, _, utilization = svgs
    for s in ("blob", "parquet", "hdf5"):
        assert f"fill: {charts.COLORS[s]}" in throughput
    assert f"fill: {charts.SPARE[0]}" in throughput  # zarr
    panels = re.findall(r'<g id="utilization-([a-z0-9]+)-([a-z0-9]+)-torch">', utilization)
    assert sorted(panels) == sorted((s, n) for s in stores for n in nodes)
    assert utilization.count(">time (s)<") == len(nodes) and ">not measured<" in utilization
    assert ">machine CPU %<" in utilization and ">benchmark process, % of all cores<" in utilization
    # one file that opens offline: nothing fetched, every link inside the page
    assert not re.search(r"<(script|link|img|iframe)\b", page)
    assert all(ref.startswith("#") for ref in re.findall(r'href="([^"]*)"', page))


def test_report_twice_is_the_same_page_but_for_the_date(tmp_path):
    write_results(tmp_path, [cell("blob", "t4", timeline=TIMELINE), cell("parquet", "t4", timeline=TIMELINE)])
    pages = []
    for _ in range(2):
        report.build(str(tmp_path), target_samples=1000, target_epochs=1)
        pages.append(re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "", (tmp_path / "report.html").read_text()))
    assert pages[0] == pages[1]


def test_layout_and_location_effects(tmp_path):
    """Every cell on one storage with one budget: the table's ratio is the layout effect, and
    the location record gives the location effect, each with its figures."""
    on = {"backend": "azurite", "profile": "azure-blob"}
    records = [cell("blob", "t4", compute=1000, ingest=50.0, real=398.0, **on),
               cell("parquet", "t4", compute=1000, ingest=400.0, real=1000.0, **on),
               cell("delta", "t4", compute=1000, ingest=500.0, real=1000.0, **on),
               location("delta", local=2000.0, on_storage=500.0)]
    write_results(tmp_path, records)
    report.build(str(tmp_path), target_samples=360_000, target_epochs=1)
    md = (tmp_path / "report.md").read_text()
    place, budget = "azurite storage, emulated azure-blob latency", "4 reader workers, 8 requests in flight"
    assert f"every store read from: {place}; {budget}" in md
    # the model: 4 KB GETs at 20.07 ms, 8 in flight: 398.7/s for the small files (360,000 in 903 s); the compacted
    # stores in 8 MB parts keep the device's 1,000/s (360 s); the fastest in bold, and the one level with it
    assert ("| t4 (estimate) on this machine (4 vCPUs) | 15 min (399/s, io-latency) | **6 min (1,000/s, compute)** | "
            "**6 min (1,000/s, compute)** |") in md
    assert (f"- **Layout effect** (compacted vs small files, both on {place}, both read with {budget}): ingest-only, "
            "the best compacted store (delta) 500 samples/s, the small files 50 samples/s: **10x**. "
            "Per node, projected: the gains under the headline.") in md
    assert (f"- **Location effect** (the same delta store, both read with {budget}): ingest-only from local disk "
            f"as it is 2,000 samples/s, from {place}: 500 samples/s: **4x** faster on local disk.") in md
    assert md.index("## Training time") < md.index("## Layout effect and location effect") < md.index("## Why")


def test_a_comparison_across_storage_is_labelled_as_mixing_location_and_layout(tmp_path):
    """Small files on emulated Azure Blob, compacted stores on local disk (as storage-bench
    measured before issue #10): the ratio is not the layout effect and says so."""
    records = [cell("blob", "t4", ingest=50.0, real=40.0, backend="azurite", profile="azure-blob"),
               cell("parquet", "t4", ingest=400.0, real=200.0)]
    write_results(tmp_path, records)
    report.build(str(tmp_path), target_samples=1000, target_epochs=1)
    md = (tmp_path / "report.md").read_text()
    assert "every store read from: different storage or budgets (see each cell)" in md
    assert ("- **Compacted vs small files, mixing location and layout**: the cells were read from different storage "
            "or with different connection budgets, so this is not the layout effect alone: ingest-only, the best "
            "compacted store (parquet) 400 samples/s, the small files 50 samples/s: **8x**.") in md
    assert "**Layout effect**" not in md and "- **Location effect**: not measured" in md


def test_the_vcpus_to_feed_one_gpu_are_the_models(tmp_path):
    """The report's "vCPUs to feed one GPU" row of a cell's GPU is model.feed of that cell, and its
    verdict names the storage client's CPU where the machine's vCPUs cannot carry the reads."""
    from tests.benchmarks.model.test_verdict import near
    from trainfeed.benchmarks.model.measured import device_of, layout_of, loader_of, storage_of
    from trainfeed.benchmarks.model.projection import feed

    rec = near(store="delta", cores=12)
    write_results(tmp_path, [rec])
    catalog = tmp_path / "catalog.csv"
    catalog.write_text("cloud,region,instance,vcpus,ram_gib,gpus,gpu_model,gpu_mem_gib,on_demand_usd_per_h,"
                       "spot_usd_per_h,price_date,source\naws,us-east-1,g-t4,4,16,1,NVIDIA T4,,1.0,,2026-01-01,test\n")
    report.build(str(tmp_path), target_samples=1000, target_epochs=1, catalog=catalog)
    md = (tmp_path / "report.md").read_text()
    model = feed(device_of(rec), layout_of(rec), loader_of(rec), storage_of(rec), rec["batch_size"])
    assert model.vcpus == 15
    # 13,000/s x 360 KB = 4.68 GB/s at 3 CPU-s/GB: 14.04 vCPUs of I/O, 13,000 x 0.04 ms = 0.52 of decode
    assert ("| h100 (estimate, 13,000 samples/s) | 4.7 GB/s at 3.00 CPU-s/GB: 15 vCPUs (I/O 14.0, decode 0.5, "
            "framework 0.0) |") in md
    assert f"3.00 CPU-s/GB: {model.describe()} |" in md
    # the catalog's T4 (estimate: 1e12 FLOPs / (8.1 TFLOPS x 35%) = 0.353 s a step of 10): 28.4/s, 0.01 GB/s
    assert ("| t4 (estimate, 28.4 samples/s) | 0.01 GB/s at 3.00 CPU-s/GB: 1 vCPU (I/O 0.0, decode 0.0, "
            "framework 0.0) |") in md
    assert md.index("## Training time") < md.index("## vCPUs to feed one GPU from near") < md.index("## Why")
    assert "| delta | h100 | torch |" in md and "| io-cpu | I/O CPU: the storage client costs 3.00 CPU-s per GB" in md
    assert "`io-cpu` (the vCPUs, with the storage client's CPU their largest consumer)" in md
