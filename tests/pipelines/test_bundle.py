"""databricks.yml, offline: valid against the bundle schema, and every reference resolves.
(No Databricks workspace is reachable from here: deployment itself is untested.)"""
from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT.parent / "shared" / "databricks" / "bundle-schema.json"


def bundle() -> dict:
    doc = yaml.safe_load((ROOT / "databricks.yml").read_text())
    resources: dict = {}
    for pattern in doc.get("include", []):
        for f in sorted(ROOT.glob(pattern)):
            for kind, items in yaml.safe_load(f.read_text())["resources"].items():
                resources.setdefault(kind, {}).update(items)
    return {**doc, "resources": resources}


@pytest.fixture(scope="module")
def validator():
    # CI and every development checkout have ../shared beside the clone: a missing schema is a
    # broken setup, never a reason to skip the only check of the bundle.
    assert SCHEMA.exists(), f"{SCHEMA} is missing: the bundle cannot be validated"
    text = SCHEMA.read_text().replace("\\\\p{L}", "[^\\\\W\\\\d_]").replace("\\\\p{N}", "\\\\d")
    return jsonschema.Draft7Validator(json.loads(text))


def jobs() -> dict:
    return bundle()["resources"]["jobs"]


def test_bundle_matches_the_schema(validator):
    errors = list(validator.iter_errors(bundle()))
    assert errors == [], [f"{list(e.path)}: {e.message}" for e in errors]


def test_schema_check_catches_mistakes(validator):
    """A negative control: the validation above can fail."""
    bad = copy.deepcopy(bundle())
    bad["resources"]["jobs"]["train"]["tasks"][0]["python_wheel_task"]["entrypoint"] = "typo"
    assert list(validator.iter_errors(bad))
    bad = copy.deepcopy(bundle())
    bad["resources"]["jobs"]["repack"]["job_clusters"][0]["new_cluster"]["num_workers"] = "many"
    assert list(validator.iter_errors(bad))


def test_targets_and_variables():
    doc = bundle()
    assert doc["targets"]["dev"] == {"mode": "development", "default": True}
    assert doc["targets"]["prod"]["mode"] == "production"
    used = set(re.findall(r"\$\{var\.(\w+)\}", json.dumps(doc)))
    assert used <= set(doc["variables"]), used - set(doc["variables"])


def test_every_reference_resolves():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    artifact = bundle()["artifacts"]["trainfeed_wheel"]
    assert "--wheel-dir dist" in artifact["build"]
    for name, job in jobs().items():
        clusters = {c["job_cluster_key"]: c["new_cluster"] for c in job["job_clusters"]}
        keys = {t["task_key"] for t in job["tasks"]}
        for task in job["tasks"]:
            assert task["job_cluster_key"] in clusters, (name, task["task_key"])
            for dep in task.get("depends_on", []):
                assert dep["task_key"] in keys, (name, dep)
            wheel = task["python_wheel_task"]
            assert wheel["package_name"] == "trainfeed"
            module, func = scripts[wheel["entry_point"]].split(":")
            assert hasattr(__import__(module, fromlist=[func]), func)
            assert task["libraries"] == [{"whl": "./dist/*.whl"}]


def test_clusters_match_the_reference_experiment():
    doc = bundle()
    ab = jobs()["storage_ab"]
    clusters = {c["job_cluster_key"]: c["new_cluster"] for c in ab["job_clusters"]}
    assert clusters["cpu_node"]["node_type_id"] == "${var.cpu_node_type}"
    assert doc["variables"]["cpu_node_type"]["default"] == "Standard_D16s_v3"
    assert doc["variables"]["gpu_node_type"]["default"] == "Standard_NC4as_T4_v3"
    assert doc["targets"]["aws"]["variables"]["gpu_node_type"] == "g4dn.xlarge"
    for c in clusters.values():
        assert c["num_workers"] == 0 and c["spark_conf"]["spark.databricks.cluster.profile"] == "singleNode"
    assert "gpu-ml" in doc["variables"]["spark_version_gpu"]["default"]
    assert [t["task_key"] for t in ab["tasks"]][-1] == "report"
