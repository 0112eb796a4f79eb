"""Scenario files (TOML): a workload, the model, the storage, the loaders and the nodes to
project onto, fixed in one file with the source of every knob written next to it, plus the
published times to compare with. ``storage-bench run --scenario FILE`` measures what the
scenario asks for here and projects it onto the scenario's nodes with the same model as
every other table (cost.projection_row)."""
from __future__ import annotations

import builtins
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from trainfeed.benchmarks.model.cost import Workload
from trainfeed.benchmarks.model.profiles import ObjectStore
from trainfeed.benchmarks.model.projection import Loader
from trainfeed.converters.errors import TrainfeedError

#: Where `storage-bench run --scenario` keeps a copy of the scenario, for `storage-bench report`.
SCENARIO_COPY = "scenario.toml"


@dataclass(frozen=True)
class ScenarioNode:
    name: str  # as the report names it ("T4 node")
    instance: str  # a catalog row's instance name
    measure: str  # the matrix node that measures it here: cpu, or an accelerator profile (t4, ...)
    cpu_speed: float = 1.0  # the instance's per-vCPU speed relative to this machine
    source: str = ""


@dataclass(frozen=True)
class Reference:
    node: str
    store: str
    seconds: float
    source: str


@dataclass(frozen=True)
class Scenario:
    name: str
    path: Path
    workload: Workload
    batch_size: int
    sample_shape: tuple[int, ...]
    width: int
    framework: str
    data_count: int  # samples generated here to measure with
    stores: tuple[str, ...]
    steps: int
    cpu_steps: int
    storage: ObjectStore
    loaders: dict[str, Loader]  # "blob" (the small files) and "compacted"
    nodes: tuple[ScenarioNode, ...]
    references: tuple[Reference, ...] = ()
    efficiency: float | None = None  # accelerators' fraction of peak, when the scenario sets one
    sources: dict[str, str] = field(default_factory=dict)  # knob -> where its value comes from

    def loader_for(self, store: str) -> Loader:
        return self.loaders["blob" if store == "blob" else "compacted"]

    def node(self, name: str) -> ScenarioNode:
        return next(n for n in self.nodes if n.name == name)


def load_scenario(path: str | Path) -> Scenario:
    """Parse and check a scenario file; every problem names the file and the key."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise TrainfeedError(f"{path}: scenario file not found") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TrainfeedError(f"{path}: not a valid TOML scenario: {exc}") from None
    get = _Getter(path, doc)
    sources = {}
    workload = Workload(get.int("workload.samples_per_epoch"), get.int("workload.epochs"))
    sources["workload"] = get.str("workload.source")
    storage = ObjectStore(get.str("storage.name"), get.float("storage.first_byte_ms", zero_ok=True),
                          get.float("storage.stream_mb_per_s"), get.int("storage.max_concurrency"),
                          get.str("storage.source"), kind="scenario")
    sources["storage"] = storage.source
    loaders = {}
    for key in ("blob", "compacted"):
        p = f"loaders.{key}"
        loaders[key] = Loader(get.str(f"{p}.name"), get.int(f"{p}.concurrency"), get.int(f"{p}.threads"),
                              get.bool(f"{p}.prefetch"), get.str(f"{p}.framework"), get.str(f"{p}.source"))
        sources[f"loader {key}"] = loaders[key].source
    nodes = []
    for i, _ in enumerate(get.list("nodes")):
        p = f"nodes.{i}"
        nodes.append(ScenarioNode(get.str(f"{p}.name"), get.str(f"{p}.instance"), get.str(f"{p}.measure"),
                                  get.float(f"{p}.cpu_speed", default=1.0), get.str(f"{p}.source")))
        sources[f"node {nodes[-1].name}"] = nodes[-1].source
    names = {n.name for n in nodes}
    refs = []
    for i, _ in enumerate(get.list("reference", required=False)):
        p = f"reference.{i}"
        ref = Reference(get.str(f"{p}.node"), get.str(f"{p}.store"), get.float(f"{p}.seconds"), get.str(f"{p}.source"))
        if ref.node not in names:
            raise TrainfeedError(f"{path}: {p}.node {ref.node!r} is not one of the scenario's nodes "
                                 f"({', '.join(names)})")
        refs.append(ref)
    efficiency = get.float("model.efficiency", default=None)
    if efficiency is not None:
        sources["accelerator efficiency"] = get.str("model.efficiency_source")
    sources["model"] = get.str("model.source")
    stores = tuple(get.list("measure.stores"))
    return Scenario(get.str("name"), path, workload, get.int("workload.batch_size"),
                    tuple(get.list("model.sample_shape")), get.int("model.width"), get.str("model.framework"),
                    get.int("measure.samples"), stores, get.int("measure.steps"), get.int("measure.cpu_steps"),
                    storage, loaders, tuple(nodes), tuple(refs), efficiency, sources)


class _Getter:
    """Typed lookups of dotted keys ("nodes.0.name") with errors that name the file and key."""

    _MISSING = object()

    def __init__(self, path: Path, doc: dict[str, Any]) -> None:
        self.path, self.doc = path, doc

    def _get(self, key: str, default: object = _MISSING) -> Any:
        """The value at ``key``: any TOML value."""
        node: Any = self.doc
        for part in key.split("."):
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            elif default is not self._MISSING:
                return default
            else:
                raise TrainfeedError(f"{self.path}: missing key {key!r}")
        return node

    def _typed(self, key: str, kinds: tuple[type, ...], what: str, default: object = _MISSING) -> Any:
        value = self._get(key, default)
        if value is default and default is not self._MISSING:
            return value
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise TrainfeedError(f"{self.path}: {key} must be {what}, got {value!r}")
        return value

    # The methods below are named after the types they return, which they shadow inside the class:
    # their annotations name the built-in types as builtins.*.
    def str(self, key: builtins.str) -> builtins.str:
        value: builtins.str = self._typed(key, (str,), "a string")
        return value

    def bool(self, key: builtins.str) -> builtins.bool:
        value: builtins.bool = self._typed(key, (bool,), "true or false")
        return value

    def int(self, key: builtins.str) -> builtins.int:
        value: builtins.int = self._typed(key, (int,), "a whole number")
        if value < 1:
            raise TrainfeedError(f"{self.path}: {key} must be at least 1, got {value}")
        return value

    @overload
    def float(self, key: builtins.str, *, zero_ok: builtins.bool = False) -> builtins.float: ...

    @overload
    def float(self, key: builtins.str, *, zero_ok: builtins.bool = False,
              default: builtins.float) -> builtins.float: ...

    @overload
    def float(self, key: builtins.str, *, zero_ok: builtins.bool = False,
              default: None) -> builtins.float | None: ...

    def float(self, key: builtins.str, *, zero_ok: builtins.bool = False,
              default: object = _MISSING) -> builtins.float | None:
        value = self._typed(key, (int, float), "a number", default)
        if value is None:
            return None
        if value < 0 or (value == 0 and not zero_ok):
            raise TrainfeedError(f"{self.path}: {key} must be {'at least 0' if zero_ok else 'above 0'}, got {value}")
        return float(value)

    def list(self, key: builtins.str, required: builtins.bool = True) -> builtins.list[Any]:
        value = self._get(key, self._MISSING if required else [])
        if not isinstance(value, list) or (required and not value):
            raise TrainfeedError(f"{self.path}: {key} must be a non-empty list")
        return value
