"""The instance catalog and DBU rates: every shipped row dated and sourced, loader errors that name
file, line and column, and `hourly_cost` checked against hand-worked figures."""
from __future__ import annotations

import pytest

from trainfeed.benchmarks.model.catalog import (
    DbuRate,
    Instance,
    hourly_cost,
    load_catalog,
    load_dbu_rates,
    write_catalog,
)
from trainfeed.converters.errors import TrainfeedError

HEADER = ("cloud,region,instance,vcpus,ram_gib,gpus,gpu_model,gpu_mem_gib,network_gbps,on_demand_usd_per_h,"
          "spot_usd_per_h,dbu_per_hour,price_date,source\n")
GOOD = "aws,us-east-1,p3.2xlarge,8,61,1,NVIDIA V100,16,10,3.06,0.6135,,2026-01-01,test\n"


def test_every_shipped_row_has_a_date_and_a_source():
    instances, _ = load_catalog()
    assert len(instances) > 40
    for inst in instances:
        assert inst.price_date and inst.source, inst.name
        if inst.on_demand is not None:
            assert inst.region and not inst.price_date.startswith("n/a"), inst.name
    names = {i.name for i in instances}
    assert {"g4dn.xlarge", "g5.48xlarge", "p4d.24xlarge", "p5.48xlarge", "Standard_NC24ads_A100_v4",
            "Standard_NC40ads_H100_v5", "Standard_D2s_v3", "Standard_D4s_v5"} <= names
    for rate in load_dbu_rates():
        assert rate.date and rate.source and rate.usd_per_dbu > 0


def test_loader_errors_name_file_line_and_column(tmp_path):
    path = tmp_path / "c.csv"
    path.write_text(HEADER + GOOD + GOOD.replace("0.6135", "cheap"))
    with pytest.raises(TrainfeedError,
                       match=f"^{path}, line 3: column 'spot_usd_per_h' must be a number, got 'cheap'$"):
        load_catalog(path)
    path.write_text(HEADER + GOOD.replace(",10,", ",-1,"))
    with pytest.raises(TrainfeedError, match="line 2: column 'network_gbps' must not be negative"):
        load_catalog(path)
    path.write_text(HEADER + GOOD.replace(",8,", ",,", 1))
    with pytest.raises(TrainfeedError, match="line 2: column 'vcpus' is required"):
        load_catalog(path)
    path.write_text(HEADER + GOOD.rstrip("\n") + ",extra\n")
    with pytest.raises(TrainfeedError, match="line 2: more cells than the 14 columns"):
        load_catalog(path)
    path.write_text(HEADER.replace("price_date,", ""))
    with pytest.raises(TrainfeedError, match="missing price_date"):
        load_catalog(path)
    rates = tmp_path / "r.csv"
    rates.write_text("cloud,plan,workload,usd_per_dbu,date,source\naws,premium,jobs,0.15,,x\n")
    with pytest.raises(TrainfeedError, match=f"^{rates}, line 2: column 'date' is required$"):
        load_dbu_rates(rates)


def test_a_catalog_without_the_new_columns_still_loads(tmp_path):
    path = tmp_path / "old.csv"
    path.write_text("cloud,region,instance,vcpus,ram_gib,gpus,gpu_model,gpu_mem_gib,on_demand_usd_per_h,"
                    "spot_usd_per_h,price_date,source\naws,,p3.2xlarge,8,61,1,NVIDIA V100,16,3.06,,2022,ref\n")
    [inst], notes = load_catalog(path)
    assert (inst.on_demand, inst.network_gbps, inst.dbu_per_hour, notes) == (3.06, None, None, [])


def test_write_then_load_gives_the_same_catalog(tmp_path):
    instances, _ = load_catalog()
    write_catalog(instances, tmp_path / "copy.csv")
    assert load_catalog(tmp_path / "copy.csv")[0] == instances


def inst(**kw) -> Instance:
    base = dict(cloud="aws", region="us-east-1", name="p3.2xlarge", vcpus=8, ram_gib=61.0, gpus=1,
                gpu_model="NVIDIA V100", gpu_mem_gib=16.0, network_gbps=None, on_demand=3.06, spot=0.92,
                price_date="2026-01-01", source="test", dbu_per_hour=2.5)
    return Instance(**{**base, **kw})


JOBS = DbuRate("aws", "premium", "jobs", 0.15, "2026-04-10", "test")


def test_hourly_cost_is_vm_plus_dbus_times_rate():
    assert hourly_cost(inst()) == 3.06  # VM only
    assert hourly_cost(inst(), dbu=JOBS) == pytest.approx(3.435)  # 3.06 + 2.5 DBU/h x 0.15 $/DBU = 3.06 + 0.375
    assert hourly_cost(inst(), spot=True, dbu=JOBS) == pytest.approx(1.295)  # 0.92 + 0.375
    assert hourly_cost(inst(dbu_per_hour=None), dbu=JOBS) == 3.06  # DBUs not known: VM only
    assert hourly_cost(inst(spot=None), spot=True, dbu=JOBS) is None
    with pytest.raises(TrainfeedError, match="DBU rate for azure applied to aws instance p3.2xlarge"):
        hourly_cost(inst(), dbu=DbuRate("azure", "premium", "jobs", 0.3, "2026-04-10", "test"))
