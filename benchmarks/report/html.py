"""report.html: the report's Markdown rendered by markdown-it-py, with the charts inline as SVG,
in one page that opens offline."""
from __future__ import annotations

from markdown_it import MarkdownIt

from trainfeed.benchmarks.records import CellKey, Record
from trainfeed.benchmarks.report import charts as charts_mod

#: CommonMark plus tables; raw HTML in the Markdown (an error message, say) is shown, not run.
_MARKDOWN = MarkdownIt("commonmark", {"html": False}).enable("table")


def html(md: str, cells: dict[CellKey, Record], stores: list[str], nodes: list[str], frameworks: list[str],
         catalog_md: str = "") -> str:
    """The page: the report's Markdown, the charts before "Why: each cell", and the whole catalog
    (``catalog_md``) folded in a <details> at the end of "What it costs"."""
    charts = [draw(cells, stores, nodes, fw) for fw in frameworks
              for draw in (charts_mod.throughput, charts_mod.stall, charts_mod.utilization)]
    body = _MARKDOWN.render(md)
    split = body.find("<h2>Why")
    if split >= 0:
        body = body[:split] + '<h2>Charts</h2><div class="charts">' + "".join(charts) + "</div>" + body[split:]
    costs = body.find("<h2>What it costs")
    if catalog_md and costs >= 0:
        end = body.find("<h2", costs + 1)
        end = len(body) if end < 0 else end
        folded = ('<details class="catalog"><summary>Every instance of the catalog (also in costs.csv)</summary>'
                  + _MARKDOWN.render(catalog_md) + "</details>")
        body = body[:end] + folded + body[end:]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>trainfeed storage A/B report</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 13px; }}
th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }}
th {{ background: #f3f3f3; }}
.charts svg {{ display: block; margin: 1.5em 0; max-width: 100%; height: auto; }}
ul {{ margin: 0.2em 0; }}
details.catalog {{ margin: 1em 0; }}
details.catalog summary {{ cursor: pointer; font-weight: 600; }}
</style></head><body>
{body}
</body></html>
"""
