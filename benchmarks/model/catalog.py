"""The instance catalog (benchmarks/model/instances.csv) and Databricks DBU rates (benchmarks/model/dbu_rates.csv):
shapes and hourly prices, every price with the date and the source it was read from.

Money is USD per hour throughout: VM prices are Linux on-demand / spot per instance-hour; a DBU rate
is USD per DBU and an instance's ``dbu_per_hour`` is the DBUs it burns per hour.
"""
from __future__ import annotations

import csv
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar, overload

from trainfeed.converters.errors import TrainfeedError

CATALOG = Path(__file__).with_name("instances.csv")
DBU_RATES = Path(__file__).with_name("dbu_rates.csv")
#: required catalog columns (older catalogs have exactly these)
COLUMNS = ("cloud", "region", "instance", "vcpus", "ram_gib", "gpus", "gpu_model", "gpu_mem_gib",
           "on_demand_usd_per_h", "spot_usd_per_h", "price_date", "source")
#: the columns a catalog is written with; network_gbps and dbu_per_hour may be absent when read
WRITTEN = ("cloud", "region", "instance", "vcpus", "ram_gib", "gpus", "gpu_model", "gpu_mem_gib", "network_gbps",
           "on_demand_usd_per_h", "spot_usd_per_h", "dbu_per_hour", "price_date", "source")
DBU_COLUMNS = ("cloud", "plan", "workload", "usd_per_dbu", "date", "source")


@dataclass(frozen=True)
class Instance:
    cloud: str
    region: str
    name: str
    vcpus: int
    ram_gib: float
    gpus: int
    gpu_model: str
    gpu_mem_gib: float | None  # None where not sourced
    network_gbps: float | None
    on_demand: float | None  # USD per hour, Linux, on demand
    spot: float | None  # USD per hour
    price_date: str
    source: str
    dbu_per_hour: float | None = None  # Databricks DBUs per hour for this instance type, where sourced


@dataclass(frozen=True)
class DbuRate:
    cloud: str
    plan: str
    workload: str
    usd_per_dbu: float
    date: str
    source: str


_Number = TypeVar("_Number", int, float)


class _Row:
    """One CSV row and where it is, so that every bad cell is reported as file, line and column."""

    def __init__(self, path: Path, line: int, cells: dict[str, str | None]) -> None:
        self.path, self.line, self.cells = path, line, cells

    def text(self, column: str) -> str:
        return (self.cells.get(column) or "").strip()

    @overload
    def number(self, column: str, kind: type[_Number], *, required: Literal[True]) -> _Number: ...

    @overload
    def number(self, column: str, kind: type[_Number], *, required: Literal[False] = False) -> _Number | None: ...

    def number(self, column: str, kind: type[_Number], *, required: bool = False) -> _Number | None:
        value = self.text(column)
        if value == "":
            if required:
                raise TrainfeedError(f"{self.path}, line {self.line}: column {column!r} is required")
            return None
        try:
            number = kind(value)
        except ValueError:
            raise TrainfeedError(f"{self.path}, line {self.line}: column {column!r} must be a number, "
                                 f"got {value!r}") from None
        if number < 0:
            raise TrainfeedError(f"{self.path}, line {self.line}: column {column!r} must not be negative, "
                                 f"got {value!r}")
        return number


def _rows(path: Path, columns: tuple[str, ...], what: str) -> list[_Row]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            rows = [_Row(path, reader.line_num, r) for r in reader]
    except FileNotFoundError:
        raise TrainfeedError(f"{path}: {what} not found") from None
    missing = [c for c in columns if c not in header]
    if missing:
        raise TrainfeedError(f"{path}: {what} needs the columns {', '.join(columns)}; missing {', '.join(missing)}")
    for r in rows:
        if None in r.cells:
            raise TrainfeedError(f"{path}, line {r.line}: more cells than the {len(header)} columns of the header")
    return rows


def load_catalog(path: Path = CATALOG) -> tuple[list[Instance], list[str]]:
    """Instances, and notes about rows that cannot be priced (kept out of cost projections)."""
    path = Path(path)
    out, notes = [], []
    for r in _rows(path, COLUMNS, "instance catalog"):
        if not r.text("instance"):
            raise TrainfeedError(f"{path}, line {r.line}: column 'instance' is required")
        inst = Instance(cloud=r.text("cloud"), region=r.text("region"), name=r.text("instance"),
                        vcpus=r.number("vcpus", int, required=True), ram_gib=r.number("ram_gib", float) or 0.0,
                        gpus=r.number("gpus", int) or 0, gpu_model=r.text("gpu_model"),
                        gpu_mem_gib=r.number("gpu_mem_gib", float), network_gbps=r.number("network_gbps", float),
                        on_demand=r.number("on_demand_usd_per_h", float), spot=r.number("spot_usd_per_h", float),
                        price_date=r.text("price_date"), source=r.text("source"),
                        dbu_per_hour=r.number("dbu_per_hour", float))
        if inst.on_demand is None:
            notes.append(f"{path.name}, line {r.line} ({inst.cloud} {inst.name}): no on-demand price; "
                         "time projected, cost not")
        out.append(inst)
    return out, notes


def load_dbu_rates(path: Path = DBU_RATES) -> list[DbuRate]:
    path = Path(path)
    out = []
    for r in _rows(path, DBU_COLUMNS, "DBU rate table"):
        for column in ("cloud", "plan", "workload", "date", "source"):
            if not r.text(column):
                raise TrainfeedError(f"{path}, line {r.line}: column {column!r} is required")
        out.append(DbuRate(r.text("cloud"), r.text("plan"), r.text("workload"),
                           r.number("usd_per_dbu", float, required=True), r.text("date"), r.text("source")))
    return out


def hourly_cost(inst: Instance, *, spot: bool = False, dbu: DbuRate | None = None) -> float | None:
    """USD per hour of one instance: its VM price (spot or on demand), plus its DBUs x the DBU rate
    when both are known. None when the VM price is not known."""
    vm = inst.spot if spot else inst.on_demand
    if vm is None:
        return None
    if dbu is None or inst.dbu_per_hour is None:
        return vm
    if dbu.cloud != inst.cloud:
        raise TrainfeedError(f"DBU rate for {dbu.cloud} applied to {inst.cloud} instance {inst.name}")
    return vm + inst.dbu_per_hour * dbu.usd_per_dbu


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def catalog_row(inst: Instance) -> dict[str, str]:
    """The CSV cells of one instance (the inverse of `load_catalog`)."""
    values = {"cloud": inst.cloud, "region": inst.region, "instance": inst.name, "vcpus": inst.vcpus,
              "ram_gib": inst.ram_gib, "gpus": inst.gpus, "gpu_model": inst.gpu_model, "gpu_mem_gib": inst.gpu_mem_gib,
              "network_gbps": inst.network_gbps, "on_demand_usd_per_h": inst.on_demand, "spot_usd_per_h": inst.spot,
              "dbu_per_hour": inst.dbu_per_hour, "price_date": inst.price_date, "source": inst.source}
    return {k: _cell(values[k]) for k in WRITTEN}


def write_catalog(instances: list[Instance], path: Path) -> None:
    """Write a catalog atomically: a temporary file in the same folder, renamed over PATH, so a
    reader never sees half a catalog and a failure leaves PATH as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=WRITTEN, lineterminator="\n")
            writer.writeheader()
            writer.writerows(catalog_row(i) for i in instances)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
