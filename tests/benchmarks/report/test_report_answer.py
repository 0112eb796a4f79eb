"""The report answers first (issue #25): its first screen says what to do, for how long and
how much, how sure the tool is and what binds; the costs show the rows that matter (the whole
catalog in costs.csv and folded in the page); a note repeated across cells is written once;
no number is in scientific notation; and a figure too short to mean anything, or one the
model's physics rule out, is said to be so, never given as a ratio."""
from __future__ import annotations

import csv
import re
import shutil
import subprocess

import pytest

from tests.benchmarks.recorded import cell, location
from tests.benchmarks.report.test_report import write_results
from trainfeed.benchmarks.report import report

ON = {"backend": "azurite", "profile": "azure-blob"}


def ab_records(**ingest_extra) -> list[dict]:
    records = [cell("blob", "t4", compute=1000, ingest=50.0, real=398.0, **ON),
               cell("parquet", "t4", compute=1000, ingest=400.0, real=1000.0, **ON),
               cell("blob", "cpu", compute=20, ingest=50.0, real=15.0, node_kind="real", cpu_step_s=1.6, **ON),
               cell("parquet", "cpu", compute=20, ingest=400.0, real=19.0, node_kind="real", cpu_step_s=1.6, **ON)]
    for r in records:
        r["ingest_only"].update(ingest_extra)
    return records


def test_the_first_screen_is_the_answer(tmp_path):
    write_results(tmp_path, ab_records(seconds=2.0, timed_samples=100))
    info = report.build(str(tmp_path), target_samples=360_000, target_epochs=2)
    md = (tmp_path / "report.md").read_text()
    head = md.split("\n## Training time")[0]
    rec = info["recommendation"]["cheapest"]
    assert "## What to do" in head and len(head.splitlines()) <= 16
    assert (f"**Use {rec['option']} on {rec['cloud']} {rec['machine']}**: " in head
            and " per job on demand (" in head
            and "for 360,000 samples x 2 epochs, the cheapest of the catalog." in head)
    assert re.search(r"^- \*\*What binds\*\*: [a-z-]+: .+ sets the pace", head, re.M), head
    assert "- **Repacking** on t4: parquet is " in head
    assert re.search(r"^- \*\*How sure\*\*: (high|medium|low): ", head, re.M)
    assert "## Recommendation" not in md  # said once, at the top
    assert md.index("## What to do") < md.index("## Training time") < md.index("## What it costs")


def test_costs_show_the_rows_that_matter_and_the_catalog_is_folded(tmp_path):
    write_results(tmp_path, ab_records(seconds=2.0, timed_samples=100))
    report.build(str(tmp_path), target_samples=360_000, target_epochs=2)
    md = (tmp_path / "report.md").read_text()
    costs = md.split("## What it costs")[1].split("\n## ")[0]
    rows = [line for line in costs.splitlines() if line.startswith("| ") and not line.startswith("| why listed")]
    catalog = list(csv.DictReader((tmp_path / "costs.csv").open()))
    assert len(rows) <= 12 < len(catalog)
    assert f"of {len(catalog):,} projected" in costs
    whys = [r.split(" | ")[0][2:] for r in rows]
    assert any("fastest" in w for w in whys) and any("cheapest" in w for w in whys)
    assert any(w.startswith("best per $ on") for w in whys)
    # every row of the report is a row of costs.csv, the same instance at the same cost
    by_key = {(r["option"], f"{r['cloud']} {r['instance']}"): r for r in catalog}
    for row in rows:
        cols = row.split(" | ")
        assert (cols[1], cols[2]) in by_key
    page = (tmp_path / "report.html").read_text()
    folded = page.split('<details class="catalog">')[1].split("</details>")[0]
    assert folded.count("<tr>") - folded.count("<th>") // 13 == len(catalog)
    assert page.index("<h2>What it costs") < page.index('<details class="catalog">') < page.index("<h2>How the")


def test_a_note_repeated_across_cells_is_written_once(tmp_path):
    busy = ["another process took 60% of the CPU"]
    write_results(tmp_path, [cell(s, n, contended=busy, **ON) for s in ("blob", "parquet") for n in ("t4", "h100")])
    report.build(str(tmp_path), target_samples=10_000, target_epochs=1)
    md = (tmp_path / "report.md").read_text()
    assert md.count("real run measured under contention: wall rates are low and noisy") == 1
    why = md.split("## Why: each cell")[1].split("\n## ")[0]
    assert [line.rsplit(" | ", 1)[1] for line in why.splitlines() if line.startswith(("| blob", "| parquet"))] == \
        ["[1] (another process took 60% of the CPU) |"] * 4
    assert "- **How sure**: low: 4 of 4 cells were measured under contention" in md


def test_no_number_is_in_scientific_notation(tmp_path):
    """Huge and tiny figures (a 650M-sample job on a slow CPU, fractions of a cent per 1k samples)."""
    write_results(tmp_path, ab_records(seconds=2.0, timed_samples=100))
    report.build(str(tmp_path), target_samples=650_000_000, target_epochs=50)
    md = (tmp_path / "report.md").read_text()
    page = (tmp_path / "report.html").read_text()
    scientific = re.compile(r"\b\d(\.\d+)?e[+-]?\d+\b")
    assert not scientific.search(md), scientific.search(md)
    assert not scientific.search(re.sub(r"<svg.*?</svg>", "", page, flags=re.S))


def test_figures_too_short_or_against_the_model_are_flagged_not_given_as_ratios(tmp_path):
    """25 images: the ingest took 3 ms (a "284x" layout effect), emulated storage beat local
    disk, a cell ran above the model's bound: each is said to be so, with the reason."""
    records = ab_records(seconds=0.003, timed_samples=8)
    records.append(location("parquet", local=900.0, on_storage=1100.0))
    records[1]["real"]["samples_per_s"] = 5000.0  # the model allows 1,000/s
    write_results(tmp_path, records)
    report.build(str(tmp_path), target_samples=10_000, target_epochs=1)
    md = (tmp_path / "report.md").read_text()
    effects = md.split("## Layout effect and location effect")[1].split("\n## ")[0]
    assert ("**Layout effect** (compacted vs small files, both on azurite storage, emulated azure-blob latency, both "
            "read with 4 reader workers, 8 requests in flight): not measured: the ingest-only read of blob was too "
            "short to mean anything (3 ms, 8 samples timed): a rate needs at least 0.5 s and 50 samples (raise "
            "--steps or use more samples)") in effects
    assert ("- **Location effect** (parquet): not measured reliably: reading through the emulated latency (1,100 "
            "samples/s) beat local disk (900), which the emulation cannot do (it only adds time)") in effects
    assert not re.search(r"\*\*[\d.,]+x\*\*", effects)  # no ratio at all
    # the figures stay in the cell, what they mean is one footnote
    (parquet_t4,) = [line for line in md.splitlines() if line.startswith("| parquet | t4 | torch |")]
    assert parquet_t4.endswith("| [1] (1,000 samples/s; 400), [2] (3 ms, 8 samples timed), [3] (real 5,000/s, model "
                               "1,000/s) |"), parquet_t4
    assert "- [2] ingest-only too short to mean anything: a rate needs at least 0.5 s and 50 samples" in md
    assert "- [3] measured above the model's bound: the model's inputs from this run" in md
    assert "- **How sure**: low: " in md


def chromium_or_skip() -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (.ci/run installs it from Debian's packages)")
    return chromium


def assert_first_viewport_holds_the_answer(chromium: str, report_html, tmp_path) -> None:
    """In Chromium at 1280x900: the recommendation ("Use ..."), what binds and how sure are inside
    the first screen; and a screenshot of that screen is a rendered page, not a blank one."""
    page = report_html.read_text()
    assert "<script" not in page
    # a copy of the page that measures itself: where the answer's lines end on a 1280x900 screen
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", """<script>
const bottom = t => { for (const el of document.querySelectorAll('p, li')) {
    if (el.textContent.startsWith(t)) return Math.round(el.getBoundingClientRect().bottom); } return -1; };
document.body.setAttribute('data-answer', [bottom('Use '), bottom('What binds'), bottom('How sure'),
    innerWidth, innerHeight].join(','));
</script></body>"""))
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900"]
    dom = subprocess.run([*flags, "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    use, binds, sure, width, height = map(int, re.search(r'data-answer="([-\d,]+)"', dom.stdout).group(1).split(","))
    assert width == 1280 and height <= 900  # headless Chromium keeps some of the window for itself
    assert use > 0 and binds > 0 and 0 < sure <= height, (use, binds, sure, height)
    shot = tmp_path / "first-screen.png"
    res = subprocess.run([*flags, f"--screenshot={shot}", report_html.resolve().as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and shot.stat().st_size > 20_000  # a rendered screen, not a blank one


@pytest.mark.slow
def test_the_first_viewport_of_the_page_holds_the_answer(tmp_path):
    chromium = chromium_or_skip()
    write_results(tmp_path, ab_records(seconds=2.0, timed_samples=100))
    report.build(str(tmp_path), target_samples=360_000, target_epochs=2)
    assert_first_viewport_holds_the_answer(chromium, tmp_path / "report.html", tmp_path)


def test_identical_gpu_rows_say_why_and_no_faster_gpu_is_advised(tmp_path):
    """A tiny model at batch 8: every emulated GPU's step is the profile's floor, so every GPU row
    is the same; the report says why and does not advise a faster GPU."""
    records = [cell(s, n, compute=2000, ingest=5000.0, real=2000.0, batch_size=8, flops_per_step=1e6)
               for s in ("blob", "parquet") for n in ("t4", "a100", "h100")]
    write_results(tmp_path, records)
    report.build(str(tmp_path), target_samples=100_000, target_epochs=1)
    md = (tmp_path / "report.md").read_text()
    assert ("- **t4, a100, h100**: the same time on every GPU: each step lasts the profile's per-step floor" in md)
    head = md.split("\n## Training time")[0]
    assert "- **What binds**: compute: the accelerator's per-step floor sets the pace: every GPU of the headline " \
           "gives the same time, so a faster GPU does not help; a larger batch does." in head
    assert "a faster or a second GPU helps" not in md
    # repacking changes nothing on any of them: said once, not once per node
    assert md.count("repacking changes little") == 1
    assert ("- **t4, a100, h100**: repacking changes little (under 15%, or within the noise): the layout is not what "
            "binds there.") in md
    # and the GPUs that feed alike share one row of "vCPUs to feed one GPU"
    feeds = md.split("## vCPUs to feed one GPU")[1].split("\n## ")[0]
    assert re.search(r"^\| t4, a100, h100(, [a-z0-9]+)* \(estimate, 2,000 samples/s\) \|", feeds, re.M), feeds


def test_your_instance_is_always_among_the_costs(tmp_path):
    from trainfeed.converters.errors import UsageError

    write_results(tmp_path, ab_records(seconds=2.0, timed_samples=100))
    report.build(str(tmp_path), target_samples=360_000, target_epochs=2, my_instance="Standard_D16s_v3")
    md = (tmp_path / "report.md").read_text()
    costs = md.split("## What it costs")[1].split("\n## ")[0]
    assert re.search(r"^\| your instance(; [^|]+)? \| [^|]+ \| azure Standard_D16s_v3 \| 16 \|", costs, re.M), costs
    with pytest.raises(UsageError) as err:
        report.build(str(tmp_path), my_instance="Standard_D16_v3")
    assert "--my-instance Standard_D16_v3: not in the catalog" in str(err.value)
    assert "did you mean Standard_D16s_v3" in str(err.value)


def test_an_unknown_instance_is_refused_before_anything_runs(tmp_path):
    from tests.benchmarks.ab.test_storage_bench import bench_cli

    res = bench_cli("run", tmp_path, "--out", tmp_path / "out", "--my-instance", "g4dn.xlargeX")
    assert res.exit_code == 2 and "--my-instance g4dn.xlargeX: not in the catalog" in res.stderr
    assert "did you mean g4dn.xlarge" in res.stderr and not (tmp_path / "out").exists()


def test_catalog_notes_are_one_line_per_problem():
    from trainfeed.benchmarks.report.sections.method import grouped_notes

    notes = ["instances.csv, line 21 (aws g4dn.4xlarge): no on-demand price; time projected, cost not",
             "instances.csv, line 60 (gcp g2-standard-8): no on-demand price; time projected, cost not",
             "instances.csv, line 7 (aws p3.2xlarge): spot price older than a year",
             "dbu_rates.csv: no rate for gcp"]
    assert grouped_notes(notes) == [
        "no on-demand price; time projected, cost not: aws g4dn.4xlarge, gcp g2-standard-8 "
        "(instances.csv, lines 21, 60)",
        "instances.csv, line 7 (aws p3.2xlarge): spot price older than a year",
        "dbu_rates.csv: no rate for gcp"]


def test_a_dataset_larger_than_ram_is_one_footnote(tmp_path):
    """20 GB of samples on 16 GiB instances: each row is marked [ram], the note said once."""
    write_results(tmp_path, ab_records(seconds=2.0, timed_samples=100))
    catalog = tmp_path / "catalog.csv"
    catalog.write_text("cloud,region,instance,vcpus,ram_gib,gpus,gpu_model,gpu_mem_gib,on_demand_usd_per_h,"
                       "spot_usd_per_h,price_date,source\n"
                       "aws,us-east-1,g-t4,4,16,1,NVIDIA T4,,1.0,,2026-01-01,test\n"
                       "aws,us-east-1,c-4,4,16,0,,,0.2,,2026-01-01,test\n")
    report.build(str(tmp_path), target_samples=5_000_000, target_epochs=1, catalog=catalog)  # x 4 KB = 20 GB
    md = (tmp_path / "report.md").read_text()
    costs = md.split("## What it costs")[1].split("\n## ")[0]
    rows = [line for line in costs.splitlines() if line.startswith("| ") and not line.startswith("| why listed")]
    assert rows and all(" [ram] | " in line for line in rows if not line.startswith("|---"))
    assert md.count("does not fit in 80% of the instance's RAM") == 1
    page = (tmp_path / "report.html").read_text()
    assert page.count("does not fit in 80% of the instance's RAM") == 2  # the costs, and the folded catalog
