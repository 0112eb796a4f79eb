"""The projected sections: the training time of each option on each node (the headline, with
what repacking gains) and the vCPUs it takes to feed one GPU."""
from __future__ import annotations

from trainfeed.benchmarks.model.advice import Advice
from trainfeed.benchmarks.model.noise import level, rule
from trainfeed.benchmarks.report.answer import GAIN_WORTH_SAYING, same_gpu_rows, worth_saying
from trainfeed.benchmarks.report.formatting import fmt_num, fmt_rate, fmt_ratio, fmt_time


def headline_section(advice: Advice) -> list[str]:
    """Each option's projected time on each node, the fastest in bold, then what repacking gains."""
    plan = advice.plan
    w = plan.workload
    lines = [f"## Training time for {w.samples:,} samples x {w.epochs} epoch{'s' if w.epochs != 1 else ''}", "",
             "Projected by one model from the quantities measured here (see \"How the projections were made\"); "
             "the bottleneck is the resource that binds. The fastest option on each node is in bold, and so is every "
             f"option level with it: {rule([r for h in advice.headline for r in h.rows])}.", ""]
    opts = [o.label for o in advice.options]
    lines += ["| node | " + " | ".join(opts) + " |", "|---|" + "---|" * len(opts)]
    for h in advice.headline:
        rows = {r["option"]: r for r in h.rows}
        best = min(h.rows, key=lambda r: r["seconds"], default=None)
        cells = []
        for o in opts:
            r = rows.get(o)
            text = f"{fmt_time(r['seconds'])} ({fmt_rate(r['samples_per_s'])}/s, {r['bottleneck']})" if r else "-"
            cells.append(f"**{text}**" if r and best and level(r, best) else text)
        label = (f"{h.node} ({h.instance})" if h.instance
                 else h.rows[0]["machine"] if h.rows else h.node)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("")
    same = same_gpu_rows(advice)
    if same:
        bound = sorted({r["bottleneck"] for h in advice.headline if h.node in same for r in h.rows})
        why = ("each step lasts the profile's per-step floor (an estimate at this small a model and batch)"
               if bound == ["compute"] else
               f"every option is bound by the same thing on each ({', '.join(bound)}), and a compute-bound step "
               "lasts the profile's per-step floor" if "compute" in bound else
               f"every option is bound outside the GPU ({', '.join(bound)})")
        lines.append(f"- **{', '.join(same)}**: the same time on every GPU: {why}; so a faster GPU does not help "
                     "here (a larger batch, or `storage-bench calibrate` on the real GPU, says more).")
    little = []
    said: dict[str, list[str]] = {}  # the same finding on several nodes is written once, naming them all
    for g in filter(None, advice.gains):
        if not worth_saying(g) and not g.better_loading:
            little.append(g.node)  # said once for all such nodes, below
            continue
        if worth_saying(g):
            text = (f"repacking ({g.repacked}) is **{fmt_ratio(g.repack_gain)}** faster than "
                    f"{g.today} ({fmt_time(g.repacked_s)} vs {fmt_time(g.today_s)})")
        else:
            text = (f"repacking ({g.repacked}) changes little ({fmt_time(g.repacked_s)} vs "
                    f"{fmt_time(g.today_s)} for {g.today}): the layout is not what binds there")
        if g.better_loading:
            text += f"; better loading alone ({g.better_loading}) would be {fmt_ratio(g.better_loading_gain)}"
        said.setdefault(text, []).append(g.node)
    lines += [f"- **{', '.join(nodes)}**: {text}." for text, nodes in said.items()]
    if little:
        lines.append(f"- **{', '.join(little)}**: repacking changes little (under "
                     f"{fmt_num((GAIN_WORTH_SAYING - 1) * 100)}%, or within the noise): the layout is not what binds "
                     "there.")
    return [*lines, ""]


def feeds_section(advice: Advice) -> list[str]:
    """Per GPU: the GB/s it reads at its own rate and the vCPUs busy feeding it (model.feed)."""
    if not advice.feeds:
        return []
    storage = advice.plan.storage
    where = storage.name if storage else "local disk"
    io = (f"the storage client's I/O CPU (GB/s x CPU-s per GB at the loader's requests in flight: "
          f"{storage.io_cpu_source})" if storage else
          "no I/O CPU apart (local reads are in the reader's measured CPU)")
    opts = [o.label for o in advice.options]
    lines = [f"## vCPUs to feed one GPU from {where}", "",
             f"One GPU at its own rate (samples/s from its step time) reading each option from {where}: the GB/s it "
             f"takes and the vCPUs busy for it: {io}, decode (the reader's CPU per sample, measured here) and the "
             "framework's host work (measured on a real GPU; 0 for an emulated or estimated one, whose step sleeps). "
             "The model's `io-cpu`, `decode` and remedies use the same figures. They hold for a PyTorch DataLoader "
             "whose workers read through trainfeed's TorchDataset: the workers hand batches over in shared memory, "
             "at 0.9-1.35x the CPU per GB of trainfeed's own threads (docs/BENCHMARKS.md).", "",
             "| GPU | " + " | ".join(opts) + " |", "|---|" + "---|" * len(opts)]
    rows: dict[tuple[str, ...], list[str]] = {}  # GPUs with the same figures (at the per-step floor, say) share a row
    for row in advice.feeds:
        d = row.device
        first = next(iter(row.feeds.values()))
        cells = []
        for o in opts:
            f = row.feeds[o]
            per_gb = f" at {f.io_cpu_s_per_gb:.2f} CPU-s/GB" if storage else ""
            cells.append(f"{fmt_num(f.gb_per_s)} GB/s{per_gb}: {f.describe()}")
        rows.setdefault((d.how, fmt_rate(first.samples_per_s), *cells), []).append(d.name)
    for (how, rate, *cells), names in rows.items():
        lines.append(f"| {', '.join(names)} ({how}, {rate} samples/s) | " + " | ".join(cells) + " |")
    return [*lines, ""]
