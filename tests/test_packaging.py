"""The wheel: one top-level package, `trainfeed`; it installs and runs in a clean Python 3.12
venv with numpy 2; it installs on the Databricks ML runtimes (15.4, 16.4, 17.3 LTS) without
changing a package they ship, but the exceptions named below; and each test environment holds
the versions it stands for."""
from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.test_api import readme_examples

ROOT = Path(__file__).resolve().parents[1]
RUNTIMES = ROOT.parent / "shared" / "databricks" / "runtime-constraints"
PROTECTED = ("numpy", "pandas", "pyarrow", "torch")


def pip(python: str | Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, env=env)


def clean_checkout(dst: Path) -> Path:
    """The files a clean checkout holds (tracked, or new and not ignored), copied to ``dst``: a
    wheel built in the working tree would also take what an earlier build left in build/
    (modules since moved or removed)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dst / name)
    return dst


def package_sources() -> set[str]:
    """The modules the wheel must hold, named as installed: pyproject's package-dir mapping applied
    to the .py files of the source tree."""
    import tomllib

    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {f"{package.replace('.', '/')}/{path.name}" for package, folder in dirs.items()
            for path in (ROOT / folder).glob("*.py")}


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    src = clean_checkout(tmp_path_factory.mktemp("checkout"))
    res = pip(sys.executable, "wheel", "--no-deps", "-q", "--wheel-dir", str(out), str(src))
    assert res.returncode == 0, res.stderr
    (whl,) = out.glob("trainfeed-*.whl")
    return whl


@pytest.mark.slow  # builds the wheel from a clean copy of the checkout (10-20 s): not for `make test-fast`
def test_the_wheel_installs_one_top_level_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = f"trainfeed-{metadata.version('trainfeed')}.dist-info"
    assert {n.split("/")[0] for n in names} == {"trainfeed", dist_info}
    subpackages = {n.split("/")[1] for n in names if n.count("/") == 2 and n.endswith("/__init__.py")}
    assert subpackages == {"converters", "training", "benchmarks", "pipelines"}
    assert "trainfeed/py.typed" in names
    assert {n for n in names if n.endswith(".py")} == package_sources()  # every module, nothing stale
    assert not [n for n in names if n.startswith("trainfeed/benchmarks/micro/")]  # make bench-*: a checkout's
    assert zipfile.ZipFile(wheel).read(f"{dist_info}/top_level.txt").decode().split() == ["trainfeed"]


def interpreter(version: str) -> str:
    """A Python of this minor version: pyenv's newest (CI's machine has 3.11 and 3.12), else
    pythonX.Y on PATH."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    found = sorted(root.glob(f"versions/{version}.*/bin/python{version}"), key=lambda p: Version(p.parts[-3]))
    for exe in [*map(str, found[-1:]), f"python{version}"]:
        try:
            res = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                 capture_output=True, text=True)
        except FileNotFoundError:
            continue
        if res.stdout.strip() == version:
            return exe
    pytest.fail(f"no Python {version} interpreter found (pyenv versions/{version}.*/bin or python{version} on PATH)")


# Runs inside the clean venv: every module but the __main__s imports (one needing an optional
# extra may miss only that extra), and stores written by the `convert` console script read back
# through the arrow reader, bit for bit.
SMOKE = textwrap.dedent("""
    import importlib, json, pkgutil, subprocess, sys
    from pathlib import Path
    import numpy as np
    import trainfeed

    assert np.__version__.startswith("2."), np.__version__
    OPTIONAL = {"torch", "tensorflow", "pyspark", "petastorm", "pynvml", "duckdb"}
    missing = {}
    for mod in pkgutil.walk_packages(trainfeed.__path__, "trainfeed."):
        if mod.name.endswith(".__main__"):  # runs its CLI when imported
            continue
        try:
            importlib.import_module(mod.name)
        except ModuleNotFoundError as exc:
            assert exc.name.split(".")[0] in OPTIONAL, (mod.name, exc.name)
            missing[mod.name] = exc.name

    from trainfeed.training.reading.readers import EpochOptions, iter_batches, open_store
    work = Path(sys.argv[1])
    rng = np.random.default_rng(0)
    truth = {}
    (work / "src").mkdir()
    for i in range(12):
        truth[f"v{i:02d}"] = rng.standard_normal((3, 4, 5)).astype("float32")
        np.save(work / "src" / f"v{i:02d}.npy", truth[f"v{i:02d}"])
    convert = Path(sys.executable).parent / "convert"
    for fmt in ("parquet", "delta", "hdf5"):
        dst = work / f"store.{fmt}"
        subprocess.run([convert, work / "src", dst, "--to", fmt, "--verify", "--no-progress"], check=True)
        store = open_store(str(dst))
        seen = {}
        for batch in iter_batches(store, EpochOptions(batch_size=5, workers=1, pool="arrow")):
            seen.update(zip(batch.ids, batch.x))
        assert seen.keys() == truth.keys(), (fmt, sorted(seen))
        for sid, arr in truth.items():
            assert seen[sid].dtype == arr.dtype and seen[sid].tobytes() == arr.tobytes(), (fmt, sid)
    # the README's Python API example, its numpy-only part, on data of its own
    import csv, os
    os.chdir(work)
    (work / "data" / "volumes").mkdir(parents=True)
    with open(work / "data" / "volumes" / "labels.csv", "w", newline="") as fh:
        rows = csv.writer(fh)
        rows.writerow(["id", "label"])
        for sid, arr in truth.items():
            np.save(work / "data" / "volumes" / f"{sid}.npy", arr)
            rows.writerow([sid, int(arr.mean() > 0)])
    exec(compile(Path(sys.argv[2]).read_text(), "README.md (Python API)", "exec"), {"__name__": "readme"})
    print(json.dumps({"numpy": np.__version__, "python": sys.version.split()[0], "missing": missing}))
""")


def install_in_a_clean_python312_venv(wheel: Path, where: Path) -> tuple[Path | None, str]:
    """`pip install WHEEL` in a new Python 3.12 venv, dependencies from PyPI at constraints/dev.txt's
    versions: the venv's python, or None and pip's error."""
    venv = where / "venv312"
    subprocess.run([interpreter("3.12"), "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # --no-compile: the smoke test compiles what it imports; the rest would be CPU spent on nothing
    res = pip(py, "install", "-q", "--no-compile", "-c", str(ROOT / "constraints" / "dev.txt"), str(wheel))
    return (py, "") if res.returncode == 0 else (None, res.stderr[-3000:])


@pytest.mark.slow
def test_the_wheel_runs_in_a_clean_python312_venv_with_numpy2(pip_work, tmp_path):
    """`pip install` of the built wheel (dependencies from PyPI at constraints/dev.txt's versions),
    then every module imports, conversions round-trip and the README's Python example runs. No
    torch: no CPU build of it for 3.12 is on this machine (only CUDA builds of several GB), and
    the wheel does not require it; the example's PyTorch part runs on 3.11 (tests/test_api.py)."""
    py, why = pip_work[VENV312].result()
    assert py is not None, why
    (tmp_path / "smoke.py").write_text(SMOKE)
    (tmp_path / "readme.py").write_text(readme_examples()[0])  # the numpy-only part: no torch for 3.12 here
    (tmp_path / "work").mkdir()
    res = subprocess.run([str(py), str(tmp_path / "smoke.py"), str(tmp_path / "work"), str(tmp_path / "readme.py")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "12 samples," in res.stdout and "parquet 12 (3, 4, 5)" in res.stdout, res.stdout[-2000:]
    facts = json.loads(res.stdout.strip().splitlines()[-1])
    assert facts["python"].startswith("3.12.") and facts["numpy"].startswith("2.")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_pins(name: str) -> dict[str, str]:
    """A runtime's package set (name~=version lines, the versions the runtime ships) as
    name -> version. The lines its header comments out (databricks-sdk, py4j, pyspark: masked
    for databricks-connect) stay out; trainfeed's core requires none of them."""
    pins = {}
    for line in (RUNTIMES / name).read_text().splitlines():
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*(?:~=|==)\s*(\S+)", line.strip())
        if m:
            pins[normalize(m[1])] = m[2]
    return pins


# The Databricks ML runtimes, each with its Python and its package sets (RUNTIMES, SOURCE.md
# there). A runtime's CPU and GPU images differ in GPU packages only: pip resolves against the
# first file, and the others must ship the same version of every package that resolution
# installs (16.4 has a GPU file only).
DATABRICKS = {
    "15.4": ("3.11", ["15.4.x-cpu-ml-scala2.12.txt", "15.4.x-gpu-ml-scala2.12.txt"]),
    "16.4": ("3.12", ["16.4.x-gpu-ml-scala2.12.txt"]),
    "17.3": ("3.12", ["17.3.x-cpu-ml-scala2.13.txt", "17.3.x-gpu-ml-scala2.13.txt"]),
}

# The packages a runtime ships that installing the wheel may replace, each with the reason
# (docs/DATABRICKS.md lists the same). Every other package of the runtime keeps its version.
CHANGES_ALLOWED = {
    "15.4": {"deprecated": "every deltalake 1.x requires deprecated >= 1.2.18 (15.4 ships 1.2.14), and "
                           "the Delta writer needs 1.x (deltalake.transaction is new in 1.0)"},
    "16.4": {},
    "17.3": {},
}


def resolve(python: str, held: dict[str, str], wheel: Path, tmp_path: Path) -> tuple[dict | None, str]:
    """What `pip install WHEEL` installs with every package of `held` at its version (pip's
    resolver, --dry-run): name -> version, or None and pip's account of the conflict."""
    (tmp_path / "held.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(held.items())))
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    res = pip(python, "install", "--dry-run", "--ignore-installed", "--report", str(report),
              "-c", str(tmp_path / "held.txt"), str(wheel))
    if res.returncode:
        text = res.stdout + res.stderr
        conflict = re.search(r"The conflict is caused by:.*?(?=\nTo fix)", text, re.S)
        return None, conflict[0] if conflict else text[-3000:]
    return {normalize(i["metadata"]["name"]): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]}, ""


@pytest.mark.slow
@pytest.mark.parametrize("runtime", sorted(DATABRICKS))
def test_installing_the_wheel_changes_no_package_the_runtime_ships(pip_work, runtime):
    """pip's resolver on the runtime's Python, no Databricks needed: the runtime's whole package
    set held at its versions. The wheel must install without upgrading or downgrading any of
    them but CHANGES_ALLOWED's, and those must still be needed (pip finds no solution holding
    them). New packages (deltalake, obstore, ...) are fine. 10-40 s each (metadata from
    PyPI)."""
    _, (first, *others) = DATABRICKS[runtime]
    allowed = CHANGES_ALLOWED[runtime]
    assert not set(allowed) & set(PROTECTED)
    pins = runtime_pins(first)
    chosen, why = pip_work[runtime, "all held"].result()
    if allowed:
        assert chosen is None, (f"the wheel installs on DBR {runtime} with {sorted(allowed)} held too: drop "
                                "them from CHANGES_ALLOWED and docs/DATABRICKS.md")
        chosen, why = pip_work[runtime, "allowed free"].result()
    assert chosen is not None, f"installing the wheel on DBR {runtime} would change a package it ships:\n{why}"
    changed = {n: f"{pins[n]} -> {v}" for n, v in chosen.items() if n in pins and v != pins[n]}
    assert set(changed) <= set(allowed), changed
    for other in others:
        theirs = runtime_pins(other)
        differ = {n: (pins.get(n), theirs.get(n)) for n in chosen if pins.get(n) != theirs.get(n)}
        assert not differ, f"{other} ships other versions than {first} of {differ}: resolve it too"


VENV312 = "venv312"


@pytest.fixture(scope="module")
def pip_work(request, wheel, tmp_path_factory) -> Iterator[dict[object, Future]]:
    """This file's pip work waits on PyPI (a clean Python 3.12 venv, 70-130 s; four resolutions,
    30-80 s each): the selected tests' pieces start together, as futures, and each test waits
    for its own. One after another they were most of the suite's tail."""
    mine = [item for item in request.session.items if item.path == Path(__file__)]
    names = {item.originalname for item in mine}
    runtimes = sorted({item.callspec.params["runtime"] for item in mine
                       if hasattr(item, "callspec") and "runtime" in item.callspec.params})
    with ThreadPoolExecutor(max_workers=5) as pool:
        work: dict[object, Future] = {}
        if test_the_wheel_runs_in_a_clean_python312_venv_with_numpy2.__name__ in names:
            work[VENV312] = pool.submit(install_in_a_clean_python312_venv, wheel, tmp_path_factory.mktemp("py312"))
        if runtimes:
            assert RUNTIMES.is_dir(), f"{RUNTIMES} is missing: the runtime package sets come from ../shared"
        for runtime in runtimes:
            python_version, (first, *_) = DATABRICKS[runtime]
            python, pins = interpreter(python_version), runtime_pins(first)
            held = {"all held": pins,
                    "allowed free": {n: v for n, v in pins.items() if n not in CHANGES_ALLOWED[runtime]}}
            for name in held if CHANGES_ALLOWED[runtime] else ["all held"]:
                work[runtime, name] = pool.submit(resolve, python, held[name], wheel,
                                                  tmp_path_factory.mktemp(f"resolve-{runtime}"))
        yield work
        for future in work.values():
            future.cancel()


def test_docs_name_the_changes_allowed_on_each_runtime():
    """docs/DATABRICKS.md's table says what the wheel changes on each runtime: "nothing", or
    each package of CHANGES_ALLOWED."""
    rows = {m[1]: m[2] for m in re.finditer(r"^\| (\d+\.\d+) LTS ML \| [^|]+ \| ([^|]+) \|",
                                           (ROOT / "docs" / "DATABRICKS.md").read_text(), re.M)}
    assert rows.keys() == DATABRICKS.keys()
    for runtime, allowed in CHANGES_ALLOWED.items():
        named = set(re.findall(r"(?:^|\. )([a-z][a-z0-9-]*): \d", rows[runtime]))
        assert named == set(allowed) and (rows[runtime].strip() == "nothing") == (not allowed), (runtime, rows[runtime])


def unmet(requirements: list[str], extras: set[str]) -> list[str]:
    """The requirements of trainfeed (core, plus the given extras) this environment does not meet."""
    broken = []
    for text in requirements:
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
            continue
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            broken.append(f"{req} (not installed)")
            continue
        if not req.specifier.contains(have, prereleases=True):
            broken.append(f"{req} (have {have})")
    return broken


@pytest.mark.petastorm
def test_the_petastorm_environment_is_trainfeed_petastorm():
    assert unmet(metadata.requires("trainfeed"), {"petastorm", "dev"}) == []
    assert Version(metadata.version("pyarrow")).major == 14
    with pytest.raises(ImportError):  # the Petastorm environment carries no TensorFlow
        importlib.import_module("tensorflow")  # a call, not an import statement: no lint fix can drop it


def test_the_main_environment_is_todays_stack():
    """What `make test` runs outside the Petastorm environment: numpy 2, pyarrow >= 19, no Petastorm."""
    assert unmet(metadata.requires("trainfeed"), {"tf", "spark", "gpu", "dev"}) == []
    assert Version(metadata.version("numpy")).major == 2
    assert Version(metadata.version("pyarrow")).major >= 19
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version("petastorm")
