"""databricks.yml, offline: every target's merged bundle is valid against the bundle schema,
every reference resolves, and the clusters, targets and job settings follow the rules below.
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

from trainfeed.converters.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT.parent / "shared" / "databricks" / "bundle-schema.json"
# what a target may override, merged over the top level as the CLI does (variables apart)
MERGED_KEYS = {"artifacts", "bundle", "permissions", "presets", "resources", "run_as", "sync", "workspace"}
LIST_KEYS = ("task_key", "job_cluster_key")  # lists of these are merged item by item, by key
LTS = {"13.3", "14.3", "15.4", "16.4", "17.3"}
NODE_TYPES = {"aws": re.compile(r"^[a-z][a-z0-9-]*\.[0-9]*x?large$|^[a-z][a-z0-9-]*\.metal$"),
              "azure": re.compile(r"^Standard_[A-Za-z0-9_]+$")}


def bundle() -> dict:
    """The top level: databricks.yml with its included resource files, no target applied."""
    doc = yaml.safe_load((ROOT / "databricks.yml").read_text())
    resources: dict = {}
    for pattern in doc.get("include", []):
        for f in sorted(ROOT.glob(pattern)):
            for kind, items in yaml.safe_load(f.read_text())["resources"].items():
                resources.setdefault(kind, {}).update(items)
    return {**doc, "resources": resources}


def jobs() -> dict:
    return bundle()["resources"]["jobs"]


def _merge(base, over):
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base[k], v) if k in base else v for k, v in over.items()}}
    key = next((k for k in LIST_KEYS if isinstance(base, list) and base and isinstance(base[0], dict) and k in base[0]),
               None)
    if key and isinstance(over, list):
        merged = {item[key]: item for item in base}
        for item in over:
            merged[item[key]] = _merge(merged[item[key]], item) if item[key] in merged else item
        return list(merged.values())
    return over


def merged(target: str) -> dict:
    """The bundle as the CLI sees it for ``target``: the target's overrides over the top level,
    its variable values as the variables' values."""
    doc = bundle()
    over = doc.pop("targets")[target]
    assert set(over) <= MERGED_KEYS | {"mode", "default", "variables"}, set(over) - MERGED_KEYS
    for key in MERGED_KEYS & set(over):
        doc[key] = _merge(doc[key], over[key]) if key in doc else over[key]
    for name, value in over.get("variables", {}).items():
        assert name in doc["variables"], f"target {target} sets undeclared variable {name}"
        doc["variables"][name] = _merge(doc["variables"][name],
                                        value if isinstance(value, dict) else {"default": value})
    return doc


def resolved(doc: dict) -> dict:
    """``doc`` with ``${var.x}`` replaced by the variables' values (other references stay)."""
    values = {k: str(v.get("default")) for k, v in doc["variables"].items()}

    def sub(text: str) -> str:
        while (new := re.sub(r"\$\{var\.(\w+)\}", lambda m: values[m.group(1)], text)) != text:
            text = new
        return text

    return json.loads(sub(json.dumps(doc)))


TARGETS = sorted(bundle()["targets"])


def cloud(target: str) -> str:
    """Targets named aws* deploy to AWS workspaces; the others (the variables' defaults) to Azure."""
    return "aws" if target.startswith("aws") else "azure"


def clusters(doc: dict):
    for name, job in doc["resources"]["jobs"].items():
        for c in job["job_clusters"]:
            yield name, c["job_cluster_key"], c["new_cluster"]


@pytest.fixture(scope="module")
def validator():
    # CI and every development checkout have ../shared beside the clone: a missing schema is a
    # broken setup, never a reason to skip the only check of the bundle.
    assert SCHEMA.exists(), f"{SCHEMA} is missing: the bundle cannot be validated"
    # Python's re has no \p{L} / \p{N}: [\p{L}\p{N}] is a word character but "_", \p{L} a letter
    text = (SCHEMA.read_text().replace("[\\\\p{L}\\\\p{N}]", "[^\\\\W_]")
            .replace("\\\\p{L}", "[^\\\\W\\\\d_]").replace("\\\\p{N}", "\\\\d"))
    return jsonschema.Draft7Validator(json.loads(text))


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_matches_the_schema(validator, target):
    errors = list(validator.iter_errors(merged(target)))
    assert errors == [], [f"{list(e.path)}: {e.message}" for e in errors]


def test_schema_check_catches_mistakes(validator):
    """A negative control: the validation above can fail."""
    bad = copy.deepcopy(bundle())
    bad["resources"]["jobs"]["train"]["tasks"][0]["python_wheel_task"]["entrypoint"] = "typo"
    assert list(validator.iter_errors(bad))
    bad = copy.deepcopy(bundle())
    bad["resources"]["jobs"]["repack"]["job_clusters"][0]["new_cluster"]["num_workers"] = "many"
    assert list(validator.iter_errors(bad))
    bad = copy.deepcopy(bundle())
    bad["resources"]["jobs"]["repack"]["job_clusters"][0]["new_cluster"]["data_security_mode"] = "DEDICATED"
    assert list(validator.iter_errors(bad))


def test_the_merge_applies_target_overrides():
    """A control of the merge the other tests rely on."""
    base = [{"task_key": "a", "x": 1, "y": {"p": 1}}, {"task_key": "b"}]
    assert _merge(base, [{"task_key": "a", "y": {"q": 2}}, {"task_key": "c"}]) == \
        [{"task_key": "a", "x": 1, "y": {"p": 1, "q": 2}}, {"task_key": "b"}, {"task_key": "c"}]
    assert resolved(merged("aws"))["variables"]["gpu_node_type"]["default"] == "g4dn.xlarge"


def test_targets_and_variables():
    doc = bundle()
    assert doc["targets"]["dev"] == {"mode": "development", "default": True}
    assert [t for t, v in doc["targets"].items() if v.get("default")] == ["dev"]
    used = set(re.findall(r"\$\{var\.(\w+)\}", json.dumps(doc)))
    assert used <= set(doc["variables"]), used - set(doc["variables"])
    # the CLI refuses a variable without a value in every target
    assert all("default" in v or "lookup" in v for v in doc["variables"].values())


def test_production_mode_has_a_root_path_and_an_identity():
    for target in TARGETS:
        if bundle()["targets"][target]["mode"] != "production":
            continue
        doc = merged(target)
        assert doc["workspace"]["root_path"].startswith("/Workspace/"), target
        identity = doc["run_as"].get("service_principal_name") or doc["run_as"].get("user_name")
        assert re.fullmatch(r"\$\{var\.\w+\}", identity), (target, identity)
    assert bundle()["targets"]["prod"]["mode"] == "production"


@pytest.mark.parametrize("target", TARGETS)
def test_every_job_cluster_is_dedicated_on_an_ml_lts_runtime(target):
    doc = merged(target)
    for job, key, c in clusters(doc):
        assert c.get("data_security_mode") in ("SINGLE_USER", "DATA_SECURITY_MODE_DEDICATED"), (job, key)
        assert c.get("single_user_name") == "${var.run_as_user}", (job, key)
        assert re.fullmatch(r"\$\{var\.spark_version_(cpu|gpu)\}", c["spark_version"]), (job, key)
    for job, key, c in clusters(resolved(doc)):
        version = re.fullmatch(r"(\d+\.\d+)\.x-(cpu|gpu)-ml-scala2\.1[23]", c["spark_version"])
        assert version and version[1] in LTS, (job, key, c["spark_version"])


@pytest.mark.parametrize("target", TARGETS)
def test_node_types_follow_the_target_cloud(target):
    pattern = NODE_TYPES[cloud(target)]
    for job, key, c in clusters(resolved(merged(target))):
        for field in ("node_type_id", "driver_node_type_id"):
            assert field not in c or pattern.match(c[field]), (target, job, key, c[field])


def test_node_type_patterns_tell_the_clouds_apart():
    assert NODE_TYPES["aws"].match("g4dn.xlarge") and NODE_TYPES["aws"].match("m5.4xlarge")
    assert not NODE_TYPES["aws"].match("Standard_NC4as_T4_v3")
    assert not NODE_TYPES["azure"].match("g4dn.xlarge")
    assert {cloud(t) for t in TARGETS} == {"aws", "azure"}


@pytest.mark.parametrize("target", TARGETS)
def test_every_job_has_a_timeout_retries_and_a_failure_mail(target):
    for name, job in merged(target)["resources"]["jobs"].items():
        assert job.get("timeout_seconds", 0) > 0, name
        assert job["email_notifications"]["on_failure"] == ["${var.alert_email}"], name
        for task in job["tasks"]:
            assert task.get("max_retries", 0) >= 1 and task.get("min_retry_interval_millis", 0) > 0, \
                (name, task["task_key"])


def test_training_runs_on_a_multi_node_gpu_cluster():
    from trainfeed.pipelines import train

    doc = resolved(merged("dev"))
    job = doc["resources"]["jobs"]["train"]
    (cluster,) = [c["new_cluster"] for c in job["job_clusters"]]
    (task,) = job["tasks"]
    assert int(cluster["num_workers"]) >= 1 and "singleNode" not in json.dumps(cluster)
    args = train.parse_args(task["python_wheel_task"]["parameters"])
    assert args.local_mode == "false" and args.device == "cuda" and args.resume
    assert args.processes == int(cluster["num_workers"]) * args.gpus_per_task  # one T4 per worker
    assert int(cluster["spark_conf"]["spark.task.resource.gpu.amount"]) == args.gpus_per_task
    # every node writes to --out and the checkpoints: a Unity Catalog volume, not a node's disk
    assert args.out.startswith("/Volumes/") and args.checkpoint_dir.startswith("/Volumes/")
    train.check_shared(args.out, args.checkpoint_dir, None)
    with pytest.raises(UsageError, match="every node sees"):
        train.check_shared(args.out, "/local_disk0/checkpoints")


def test_the_training_job_refuses_a_node_local_out_on_databricks(tmp_path, monkeypatch, capsys):
    from trainfeed.pipelines import train

    monkeypatch.setenv("DATABRICKS_RUNTIME_VERSION", "15.4")
    with pytest.raises(SystemExit) as failed:
        train.main(["--data", str(tmp_path), "--out", "/local_disk0/train", "--processes", "2",
                    "--local-mode", "false"])
    assert failed.value.code == 2 and "every node sees" in capsys.readouterr().err


def test_every_reference_resolves():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    artifact = bundle()["artifacts"]["trainfeed_wheel"]
    assert "--wheel-dir dist" in artifact["build"]
    for name, job in jobs().items():
        keys = {t["task_key"] for t in job["tasks"]}
        for task in job["tasks"]:
            assert task["job_cluster_key"] in {c["job_cluster_key"] for c in job["job_clusters"]}, name
            for dep in task.get("depends_on", []):
                assert dep["task_key"] in keys, (name, dep)
            wheel = task["python_wheel_task"]
            assert wheel["package_name"] == "trainfeed"
            module, func = scripts[wheel["entry_point"]].split(":")
            assert hasattr(__import__(module, fromlist=[func]), func)
            assert task["libraries"] == [{"whl": "./dist/*.whl"}]


def test_the_storage_ab_matches_the_reference_experiment():
    doc = bundle()
    ab = jobs()["storage_ab"]
    nodes = {c["job_cluster_key"]: c["new_cluster"] for c in ab["job_clusters"]}
    assert nodes["cpu_node"]["node_type_id"] == "${var.cpu_node_type}"
    assert nodes["gpu_node"]["node_type_id"] == "${var.gpu_node_type}"
    assert doc["variables"]["cpu_node_type"]["default"] == "Standard_D16s_v3"
    assert doc["variables"]["gpu_node_type"]["default"] == "Standard_NC4as_T4_v3"
    assert doc["targets"]["aws"]["variables"] == {"cpu_node_type": "m5.4xlarge", "gpu_node_type": "g4dn.xlarge"}
    for c in nodes.values():
        assert c["num_workers"] == 0 and c["spark_conf"]["spark.databricks.cluster.profile"] == "singleNode"
    assert "gpu-ml" in doc["variables"]["spark_version_gpu"]["default"]
    assert [t["task_key"] for t in ab["tasks"]][-1] == "report"
