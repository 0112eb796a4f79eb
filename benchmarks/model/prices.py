"""`storage-bench prices`: the instance catalog as a table (or JSON), and `--refresh` from the providers'
public price lists: the Azure Retail Prices API (Linux pay-as-you-go and Spot meters) and the AWS
price-list offer file for AmazonEC2 (OnDemand, Linux, shared tenancy). Standard library only."""
from __future__ import annotations

import datetime
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from trainfeed.benchmarks.model.catalog import (
    CATALOG,
    DBU_RATES,
    DbuRate,
    Instance,
    load_catalog,
    load_dbu_rates,
    write_catalog,
)
from trainfeed.converters.errors import TrainfeedError, UsageError

AZURE_API = "https://prices.azure.com/api/retail/prices"
AWS_PRICING = "https://pricing.us-east-1.amazonaws.com"
AWS_OFFER = "/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
UNITS = {"on_demand": "USD per hour", "spot": "USD per hour", "dbu_per_hour": "DBUs per hour",
         "usd_per_dbu": "USD per DBU"}
Echo = Callable[[str], None]


def fetch_json(url: str, timeout: float = 120.0) -> dict[str, Any]:
    """GET a JSON document; any network or HTTP failure is one clear line."""
    request = urllib.request.Request(url, headers={"User-Agent": "trainfeed storage-bench prices"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            doc: dict[str, Any] = json.load(resp)
            return doc
    except urllib.error.HTTPError as exc:
        raise TrainfeedError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = str(getattr(exc, "reason", exc)).replace("\n", " ")
        raise TrainfeedError(f"cannot reach {urllib.parse.urlsplit(url).netloc}: {reason}; "
                             "prices not refreshed, nothing written") from None
    except json.JSONDecodeError as exc:
        raise TrainfeedError(f"{url}: the answer is not JSON ({exc})") from None


def azure_items(sku: str, region: str, base_url: str = AZURE_API) -> list[dict[str, Any]]:
    """Every Consumption price item of one VM size in one region, following NextPageLink."""
    query = (f"serviceName eq 'Virtual Machines' and armSkuName eq '{sku}' and armRegionName eq '{region}' "
             "and priceType eq 'Consumption'")
    url: str | None = f"{base_url}?{urllib.parse.urlencode({'$filter': query})}"
    items: list[dict[str, Any]] = []
    while url:
        page = fetch_json(url)
        items += page.get("Items") or []
        url = page.get("NextPageLink")
    return items


def azure_prices(items: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(on demand, spot) USD per hour from Azure price items: Linux only (products named
    "... Windows" left out), Low Priority meters left out, the "Spot" meter for spot. Where a
    meter has several prices, the one in effect most recently wins."""
    latest: dict[str, tuple[str, float]] = {}
    for item in items:
        if item.get("unitOfMeasure") != "1 Hour" or item.get("currencyCode", "USD") != "USD":
            continue
        if item.get("type", item.get("priceType", "Consumption")) != "Consumption":
            continue
        meter = f"{item.get('meterName', '')} {item.get('skuName', '')}"
        if "Windows" in item.get("productName", "") or "Low Priority" in meter:
            continue
        kind = "spot" if "Spot" in meter else "on_demand"
        started = item.get("effectiveStartDate", "")
        if kind not in latest or started > latest[kind][0]:
            latest[kind] = (started, float(item["retailPrice"]))
    return (latest["on_demand"][1] if "on_demand" in latest else None,
            latest["spot"][1] if "spot" in latest else None)


def aws_prices(offer: dict[str, Any], names: set[str]) -> dict[str, float]:
    """On-demand USD per hour per instance type from an AmazonEC2 regional offer file: Linux,
    shared tenancy, no pre-installed software, plain capacity (not reservations)."""
    skus = {}
    for sku, product in (offer.get("products") or {}).items():
        a = product.get("attributes") or {}
        if (a.get("instanceType") in names and a.get("operatingSystem") == "Linux" and a.get("tenancy") == "Shared"
                and a.get("preInstalledSw") == "NA" and a.get("capacitystatus", "Used") == "Used"):
            skus[sku] = a["instanceType"]
    on_demand = (offer.get("terms") or {}).get("OnDemand") or {}
    out = {}
    for sku, name in skus.items():
        for term in (on_demand.get(sku) or {}).values():
            for dim in (term.get("priceDimensions") or {}).values():
                if dim.get("unit") == "Hrs" and "USD" in (dim.get("pricePerUnit") or {}):
                    out[name] = float(dim["pricePerUnit"]["USD"])
    return out


def refresh(instances: list[Instance], *, azure_region: str, aws_region: str, azure_url: str = AZURE_API,
            aws_url: str = AWS_PRICING, progress: Echo = lambda m: None) -> list[Instance]:
    """The catalog with its Azure and AWS rows re-priced from the providers' APIs (date = today,
    source = the API). Rows of other clouds, and rows the API has no price for, are kept as they
    were. Every price is fetched before any row changes: a failure changes nothing."""
    today = datetime.date.today().isoformat()
    out = list(instances)
    for i, inst in enumerate(instances):
        if inst.cloud != "azure":
            continue
        progress(f"Azure Retail Prices API: {inst.name} in {azure_region}")
        on_demand, spot = azure_prices(azure_items(inst.name, azure_region, azure_url))
        if on_demand is None:
            progress(f"  no Linux pay-as-you-go price for {inst.name} in {azure_region}: row kept")
            continue
        out[i] = replace(inst, region=azure_region, on_demand=on_demand, spot=spot, price_date=today,
                         source=f"{azure_url} (armSkuName {inst.name}, {azure_region}, Linux Consumption; "
                                "spot: Spot meter)")
    aws = {inst.name for inst in instances if inst.cloud == "aws"}
    if aws:
        url = aws_url + AWS_OFFER.format(region=aws_region)
        progress(f"AWS price list: AmazonEC2 offer file for {aws_region} (a large file: minutes, and memory)")
        found = aws_prices(fetch_json(url), aws)
        for i, inst in enumerate(instances):
            if inst.cloud != "aws":
                continue
            if inst.name not in found:
                progress(f"  no Linux on-demand price for {inst.name} in {aws_region}: row kept")
                continue
            out[i] = replace(inst, region=aws_region, on_demand=found[inst.name], spot=None, price_date=today,
                             source=f"{url} (OnDemand, Linux, Shared tenancy; spot is not in the price list)")
    return out


def changes(old: list[Instance], new: list[Instance]) -> list[str]:
    """One line per re-priced row: what moved."""
    lines = []
    for a, b in zip(old, new):
        if a == b:
            continue
        moved = [f"{label} {_money(getattr(a, field))} -> {_money(getattr(b, field))}"
                 for field, label in (("on_demand", "on-demand $/h"), ("spot", "spot $/h"))
                 if getattr(a, field) != getattr(b, field)]
        lines.append(f"{b.cloud} {b.region} {b.name}: {', '.join(moved) or 'price unchanged'} "
                     f"(dated {a.price_date or 'never'} -> {b.price_date})")
    return lines


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def short_source(source: str, limit: int = 90) -> str:
    """A price's source, its first clause only (the file or API it was read from), for the table."""
    head = source.split(" (")[0].split(";")[0].strip()
    return head if len(head) <= limit else head[:limit - 3].rstrip() + "..."


def table(instances: list[Instance], rates: list[DbuRate]) -> str:
    """The catalog for people: one line per instance, $ per hour, with the price's date and source."""
    head = ("cloud", "region", "instance", "vCPUs", "RAM GiB", "GPUs", "GPU", "on-demand $/h", "spot $/h", "DBU/h",
            "price date", "source")
    rows = [head] + [(i.cloud, i.region or "-", i.name, str(i.vcpus), f"{i.ram_gib:g}", str(i.gpus), i.gpu_model or "-",
                      _money(i.on_demand), _money(i.spot), _money(i.dbu_per_hour), i.price_date or "-",
                      short_source(i.source)) for i in instances]
    widths = [max(len(r[c]) for r in rows) for c in range(len(head) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines += ["", "Databricks DBU rates (USD per DBU; an instance costs VM $/h + DBU/h x rate):"]
    lines += [f"  {r.cloud} {r.plan} {r.workload}: {r.usd_per_dbu:g} $/DBU ({r.date}; {short_source(r.source)})"
              for r in rates]
    lines += ["", "$ columns: USD per hour, Linux; spot prices move hourly. "
                  "Refresh: storage-bench prices --refresh --out FILE",
              "source: where each price was read; the full text (how, which row, notes): storage-bench prices --json"]
    return "\n".join(lines)


def run(*, catalog: Path = CATALOG, dbu_rates: Path = DBU_RATES, as_json: bool = False, do_refresh: bool = False,
        azure_region: str = "eastus", aws_region: str = "us-east-1", out: Path | None = None,
        azure_url: str | None = None, aws_url: str | None = None, echo: Echo = print, progress: Echo = print) -> None:
    """The `storage-bench prices` command: print the catalog, or refresh it (written only to --out)."""
    if out is not None and not do_refresh:
        raise UsageError("--out writes a refreshed catalog: use it with --refresh")
    if out is not None and Path(out).resolve() == CATALOG.resolve():
        raise UsageError(f"--out {out}: refusing to overwrite the shipped catalog; write another file and review it")
    if out is not None and not Path(out).parent.is_dir():
        raise UsageError(f"--out {out}: folder {Path(out).parent} does not exist")
    instances, notes = load_catalog(catalog)
    if not do_refresh:
        rates = load_dbu_rates(dbu_rates)
        if as_json:
            echo(json.dumps({"units": UNITS, "instances": [asdict(i) for i in instances],
                             "dbu_rates": [asdict(r) for r in rates], "notes": notes}, indent=2))
        else:
            echo(table(instances, rates))
        return
    new = refresh(instances, azure_region=azure_region, aws_region=aws_region, azure_url=azure_url or AZURE_API,
                  aws_url=aws_url or AWS_PRICING, progress=progress)
    moved = changes(instances, new)
    if as_json:
        echo(json.dumps({"changes": moved, "written": str(out) if out else None}, indent=2))
    else:
        echo("\n".join(moved) if moved else "no price changed")
    if out is None:
        progress("nothing written: pass --out FILE to write the refreshed catalog")
    else:
        write_catalog(new, out)
        progress(f"refreshed catalog written to {out} ({len(moved)} rows re-priced)")
