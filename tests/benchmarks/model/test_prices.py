"""`storage-bench prices`: the catalog table / JSON, and `--refresh` against a real local HTTP server
that serves sample price-list answers (tests/benchmarks/data: hand-made, in the documented formats
of the Azure Retail Prices API and the AWS AmazonEC2 offer file), so the real urllib path runs."""
from __future__ import annotations

import datetime
import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import run_cli

DATA = Path(__file__).parents[1] / "data"
HEADER = ("cloud,region,instance,vcpus,ram_gib,gpus,gpu_model,gpu_mem_gib,network_gbps,on_demand_usd_per_h,"
          "spot_usd_per_h,dbu_per_hour,price_date,source\n")
ROWS = ("azure,,Standard_NC4as_T4_v3,4,28,1,NVIDIA T4,16,,0.526,0.062699,,2025-01-01,old azure source\n"
        "aws,us-east-1,g4dn.xlarge,4,16,1,NVIDIA T4,16,,0.526,0.1824,,2025-01-01,old aws source\n"
        "aws,us-east-1,p2.xlarge,4,61,1,NVIDIA K80,12,,0.90,0.27,,2022,reference 002\n"
        "gcp,,g2-standard-8,8,32,1,NVIDIA L4,24,,,,,n/a (no price),no price\n")


def bench_cli(*args):
    from trainfeed.benchmarks.cli import app

    return run_cli(app, *args)


class PriceServer:
    """Serves the sample answers; NextPageLink points at prices.azure.com as the real API's does, so
    the server rewrites that host to itself. Every request path is recorded."""

    def __init__(self):
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                owner.requests.append(self.path)
                url = urlsplit(self.path)
                if url.path == "/api/retail/prices":
                    name = "azure_retail_prices_page2.json" if "$skip" in parse_qs(url.query) else \
                        "azure_retail_prices_page1.json"
                elif url.path == "/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.json":
                    name = "aws_offer_ec2_us-east-1.json"
                else:
                    self.send_error(404)
                    return
                body = (DATA / name).read_text().replace("https://prices.azure.com", owner.base).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def refresh_args(self, catalog, *more):
        return ("prices", "--catalog", catalog, "--refresh", "--azure-url", f"{self.base}/api/retail/prices",
                "--aws-url", self.base, *more)


@pytest.fixture
def server():
    srv = PriceServer()
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


@pytest.fixture
def small_catalog(tmp_path):
    path = tmp_path / "catalog.csv"
    path.write_text(HEADER + ROWS)
    return path


def load(path):
    from trainfeed.benchmarks.model.catalog import load_catalog

    return {i.name: i for i in load_catalog(path)[0]}


def test_azure_selection_linux_on_demand_and_spot_only():
    from trainfeed.benchmarks.model.prices import azure_prices

    page1 = json.loads((DATA / "azure_retail_prices_page1.json").read_text())["Items"]
    page2 = json.loads((DATA / "azure_retail_prices_page2.json").read_text())["Items"]
    # page 1: Windows 0.9, Low Priority 0.2, Windows Spot 0.3 are not ours; Linux 0.45 from 2023
    assert azure_prices(page1) == (0.45, None)
    # with page 2: the Linux price in effect since 2024 (0.5) replaces the 2023 one; Spot meter 0.1
    assert azure_prices(page1 + page2) == (0.5, 0.1)


def test_aws_selection_linux_shared_no_software():
    from trainfeed.benchmarks.model.prices import aws_prices

    offer = json.loads((DATA / "aws_offer_ec2_us-east-1.json").read_text())
    # Windows 0.9, Dedicated 0.7, SQL Std 1.5 and the capacity-reservation SKU 0.41 are left out
    assert aws_prices(offer, {"g4dn.xlarge", "p2.xlarge"}) == {"g4dn.xlarge": 0.4}


def test_refresh_follows_pages_and_writes_out(server, small_catalog, tmp_path):
    out = tmp_path / "refreshed.csv"
    res = bench_cli(*server.refresh_args(small_catalog, "--out", out))
    assert res.exit_code == 0, res.stderr
    today = datetime.date.today().isoformat()
    new, old = load(out), load(small_catalog)
    az = new["Standard_NC4as_T4_v3"]
    assert (az.region, az.on_demand, az.spot, az.price_date) == ("eastus", 0.5, 0.1, today)
    assert az.source.startswith(f"{server.base}/api/retail/prices (armSkuName Standard_NC4as_T4_v3, eastus")
    aws = new["g4dn.xlarge"]
    assert (aws.region, aws.on_demand, aws.spot, aws.price_date) == ("us-east-1", 0.4, None, today)
    assert aws.source.startswith(f"{server.base}/offers/v1.0/aws/AmazonEC2/current/us-east-1/index.json")
    assert new["p2.xlarge"] == old["p2.xlarge"]  # not in the offer file: kept as it was
    assert new["g2-standard-8"] == old["g2-standard-8"]  # another cloud: untouched
    azure_calls = [p for p in server.requests if p.startswith("/api/retail/prices")]
    assert len(azure_calls) == 2 and "$skip" in parse_qs(urlsplit(azure_calls[1]).query)
    query = parse_qs(urlsplit(azure_calls[0]).query)["$filter"][0]
    assert query == ("serviceName eq 'Virtual Machines' and armSkuName eq 'Standard_NC4as_T4_v3' and "
                     "armRegionName eq 'eastus' and priceType eq 'Consumption'")
    assert "Standard_NC4as_T4_v3: on-demand $/h 0.526 -> 0.5, spot $/h 0.062699 -> 0.1" in res.stdout
    assert "g4dn.xlarge: on-demand $/h 0.526 -> 0.4, spot $/h 0.1824 -> -" in res.stdout
    assert "refreshed catalog written to" in res.stderr


def test_refresh_without_out_only_prints(server, small_catalog, tmp_path):
    before = sorted(tmp_path.iterdir())
    res = bench_cli(*server.refresh_args(small_catalog, "--region", "eastus"))
    assert res.exit_code == 0, res.stderr
    assert "on-demand $/h 0.526 -> 0.5" in res.stdout and "nothing written" in res.stderr
    assert sorted(tmp_path.iterdir()) == before and load(small_catalog)["g4dn.xlarge"].on_demand == 0.526


def test_unreachable_host_is_one_line_and_writes_nothing(small_catalog, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "refreshed.csv"
    res = bench_cli("prices", "--catalog", small_catalog, "--refresh", "--out", out,
                    "--azure-url", f"http://127.0.0.1:{port}/api/retail/prices", "--aws-url", f"http://127.0.0.1:{port}")
    assert res.exit_code == 1
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and errors[0].startswith(f"error: cannot reach 127.0.0.1:{port}:")
    assert "Traceback" not in res.stderr and not out.exists()


def test_out_is_written_atomically_and_the_shipped_catalog_is_untouched(server, small_catalog, tmp_path,
                                                                       monkeypatch):
    from trainfeed.benchmarks.model import catalog

    shipped = hashlib.sha256(catalog.CATALOG.read_bytes()).hexdigest()
    renames = []
    real_replace = catalog.os.replace

    def recording_replace(src, dst):
        renames.append((Path(src), Path(dst), Path(src).read_text()))
        real_replace(src, dst)

    monkeypatch.setattr(catalog.os, "replace", recording_replace)
    out = tmp_path / "refreshed.csv"
    assert bench_cli(*server.refresh_args(small_catalog, "--out", out)).exit_code == 0
    [(src, dst, text)] = renames
    assert dst == out and src.parent == out.parent and src.name.startswith(".refreshed.csv.")
    assert text == out.read_text() and not src.exists()  # the whole file was in the temp file before the rename
    res = bench_cli(*server.refresh_args(small_catalog, "--out", catalog.CATALOG))
    assert res.exit_code == 2 and "refusing to overwrite the shipped catalog" in res.stderr
    assert hashlib.sha256(catalog.CATALOG.read_bytes()).hexdigest() == shipped


def test_out_needs_refresh(small_catalog, tmp_path):
    res = bench_cli("prices", "--catalog", small_catalog, "--out", tmp_path / "x.csv")
    assert res.exit_code == 2 and "use it with --refresh" in res.stderr


def test_table_and_json_of_the_shipped_catalog():
    from trainfeed.benchmarks.model.catalog import load_catalog, load_dbu_rates

    instances, _ = load_catalog()
    res = bench_cli("prices")
    assert res.exit_code == 0, res.stderr
    header = res.stdout.splitlines()[0].split()
    assert (header[:3] == ["cloud", "region", "instance"] and "$/h" in header
            and header[-3:] == ["price", "date", "source"])
    g5 = next(line for line in res.stdout.splitlines() if " g5.xlarge " in line)
    assert "1.006" in g5 and "0.3948" in g5 and "skypilot-catalog" in g5
    doc = json.loads(bench_cli("prices", "--json").stdout)
    assert doc["units"]["on_demand"] == "USD per hour"
    assert len(doc["instances"]) == len(instances) and len(doc["dbu_rates"]) == len(load_dbu_rates())
    row = next(i for i in doc["instances"] if i["name"] == "Standard_NC24ads_A100_v4")
    assert (row["on_demand"], row["spot"], row["region"]) == (3.673, 0.444433, "eastus")
