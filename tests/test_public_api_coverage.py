"""Issue #26 (5): the public API is tested through the public API: every name of
``trainfeed.__all__`` and every keyword of it is used at least once by a test file.

What is required (collected with ``inspect`` from ``trainfeed.__all__``):

- every public name is referenced (``trainfeed.NAME``, or ``NAME`` after ``from trainfeed import NAME``);
- functions (``convert``, ``open_store``, ``tf_dataset``, ``train``): every parameter is passed
  (by keyword, or positionally in its place) -- ``NAME.param``;
- classes a user builds (``TorchDataset``, ``OpenOptions``, ``EpochOptions``, ``TrainConfig``,
  ``ForeignSchema``): every constructor parameter (dataclass fields included) -- ``NAME.param``;
- classes the API hands back (``RESULTS``: ``Store``, ``Batch``, ``ConvertResult``,
  ``TrainResult``): every dataclass field is read -- ``NAME.field (read)``; their constructors are
  not for users and are not required;
- every class: each public method defined on it is called -- ``NAME.method()`` -- with each of
  its parameters -- ``NAME.method.param``; each public property and plain class attribute
  (``TrainfeedError.exit_code``) is read -- ``NAME.attr (read)``.
  Exceptions only need their name used (and their own attributes read).

What is recognised in the test files (every ``tests/**/*.py`` that imports the public API with
``import trainfeed [as m]`` or ``from trainfeed import NAME [as a]``; this module excluded):

- calls ``trainfeed.NAME(...)`` / ``a(...)``; their keywords, their positional arguments mapped
  to the parameters in order (up to a ``*args``), and ``**`` of a dict literal, of ``dict(k=...)``
  or of a name the enclosing function (or the module) assigns one of these (other ``**kwargs``,
  a function's parameters among them, are not followed);
- members (``X.method(...)``, ``X.attr``) where the receiver ``X`` has a known public type:
  the class itself (``trainfeed.ConvertResult.from_summary``), a call of the API
  (``trainfeed.open_store(...)`` is a ``Store``: the types come from the return annotations,
  properties and dataclass field types, ``Iterator[Batch]`` included), ``list``/``iter``/
  ``sorted``/``next``/indexing of such a value, a name assigned (``a, b = x, y`` too) or
  ``for``-bound (loops and comprehensions) from one, or a parameter annotated with a public
  class. Names are typed per file, not per scope (a name typed anywhere in a file is that type
  everywhere in it), and a receiver of unknown type (a fixture's return value, a wrapper's)
  counts for nothing.

Not recognised: code inside strings (the README examples ``exec``'d by tests), ``getattr``,
wrappers that forward ``**kwargs``, and internal paths (``from trainfeed.training.config import
TrainConfig`` is not the public API).
"""
from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import trainfeed

TESTS = Path(__file__).resolve().parent
#: Classes the API returns (open_store, Store.batches, convert, train): read, not built.
RESULTS = ("Store", "Batch", "ConvertResult", "TrainResult")
ITERABLES = {"Iterator", "Iterable", "Generator", "list", "Sequence", "tuple"}
CLASSES = {name for name in trainfeed.__all__ if inspect.isclass(getattr(trainfeed, name))}


# ------------------------------------------------------------------ what the API declares

def _parameters(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values()
            if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _annotation_node(annotation) -> ast.expr | None:
    if isinstance(annotation, str):
        return ast.parse(annotation, mode="eval").body
    if inspect.isclass(annotation):
        return ast.Name(annotation.__name__)
    return None


def annotation_types(node: ast.expr | None) -> set[str]:
    """The public classes an annotation names: ``Store``, ``X | None``, ``Iterator[Batch]``
    (-> ``iter:Batch``); anything else is no known type."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return annotation_types(_annotation_node(node.value))
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = node.id if isinstance(node, ast.Name) else node.attr
        return {name} if name in CLASSES else set()
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return annotation_types(node.left) | annotation_types(node.right)
    if isinstance(node, ast.Subscript):
        outer = node.value.id if isinstance(node.value, ast.Name) else getattr(node.value, "attr", "")
        if outer == "Optional":
            return annotation_types(node.slice)
        if outer in ITERABLES:
            inner = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
            return {f"iter:{t}" for t in annotation_types(inner) if not t.startswith("iter:")}
    return set()


class Api:
    """``trainfeed.__all__`` as requirements: names, keywords, methods and attributes."""

    def __init__(self):
        self.names = list(trainfeed.__all__)
        self.objects = {name: getattr(trainfeed, name) for name in self.names}
        self.classes = CLASSES
        self.params: dict[str, list[inspect.Parameter]] = {}  # callable ("convert", "Store.batches") -> parameters
        self.returns: dict[str, object] = {}  # callable or "Class.attr" -> annotation
        self.methods: dict[str, set[str]] = {name: set() for name in self.classes}
        self.reads: dict[str, set[str]] = {name: set() for name in self.classes}
        for name, obj in self.objects.items():
            if name in self.classes:
                self._add_class(name, obj)
            elif callable(obj):
                self.params[name] = _parameters(obj)
                self.returns[name] = inspect.signature(obj).return_annotation

    def _add_class(self, name: str, cls: type) -> None:
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if name not in RESULTS and not issubclass(cls, BaseException):
            self.params[name] = _parameters(cls)
        for field in fields.values():
            self.returns[f"{name}.{field.name}"] = field.type
            if name in RESULTS:
                self.reads[name].add(field.name)
        for member, value in vars(cls).items():
            if member.startswith("_") or member in fields:
                continue
            if isinstance(value, property):
                self.reads[name].add(member)
                self.returns[f"{name}.{member}"] = inspect.signature(value.fget).return_annotation
            elif isinstance(value, (classmethod, staticmethod)) or inspect.isfunction(value):
                method = getattr(cls, member)
                self.methods[name].add(member)
                self.params[f"{name}.{member}"] = _parameters(method)
                self.returns[f"{name}.{member}"] = inspect.signature(method).return_annotation
            else:
                self.reads[name].add(member)

    def required(self) -> set[str]:
        out = set(self.names)
        for callable_name, params in self.params.items():
            out |= {f"{callable_name}.{p.name}" for p in params}
        for cls in self.classes:
            out |= {f"{cls}.{m}()" for m in self.methods[cls]}
            out |= {f"{cls}.{a} (read)" for a in self.reads[cls]}
        return out

    def type_of_member(self, cls: str, member: str) -> set[str]:
        return annotation_types(_annotation_node(self.returns.get(f"{cls}.{member}")))


API = Api()


# ------------------------------------------------------------------ what the tests use

class FileUses:
    """The public API one test file uses (see the module docstring for what is recognised)."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.modules: set[str] = set()  # local names of the trainfeed module
        self.aliases: dict[str, str] = {}  # local name -> public name
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                self.modules |= {a.asname or a.name for a in node.names if a.name == "trainfeed"}
            elif isinstance(node, ast.ImportFrom) and node.module == "trainfeed" and node.level == 0:
                self.aliases |= {a.asname or a.name: a.name for a in node.names if a.name in API.names}
        self.env: dict[str, set[str]] = {}
        self.used: set[str] = set()

    @property
    def imports_api(self) -> bool:
        return bool(self.modules or self.aliases)

    def public(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.modules \
                and node.attr in API.names:
            return node.attr
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return self.aliases[node.id]
        return None

    def type_of(self, node: ast.AST) -> set[str]:
        name = self.public(node)
        if name is not None:
            return {name} if name in API.classes else set()
        if isinstance(node, ast.Name):
            return self.env.get(node.id, set())
        if isinstance(node, ast.Call):
            callee = self.public(node.func)
            if callee in API.classes:
                return {callee}
            if callee is not None:
                return annotation_types(_annotation_node(API.returns.get(callee)))
            if isinstance(node.func, ast.Attribute):
                return {t for cls in self.type_of(node.func.value) if cls in API.classes
                        and node.func.attr in API.methods[cls] for t in API.type_of_member(cls, node.func.attr)}
            if isinstance(node.func, ast.Name) and node.args:
                inner = self.type_of(node.args[0])
                if node.func.id in ("list", "iter", "sorted", "tuple", "reversed"):
                    return {t for t in inner if t.startswith("iter:")}
                if node.func.id == "next":
                    return elements(inner)
            return set()
        if isinstance(node, ast.Attribute):
            return {t for cls in self.type_of(node.value) if cls in API.classes
                    and node.attr in API.reads[cls] | set(getattr(API.objects[cls], "__dataclass_fields__", ()))
                    for t in API.type_of_member(cls, node.attr)}
        if isinstance(node, ast.Subscript):
            inner = self.type_of(node.value)
            return inner if isinstance(node.slice, ast.Slice) else elements(inner)
        return set()

    def bind(self, target: ast.AST, types: set[str]) -> None:
        if isinstance(target, ast.Name) and types:
            self.env.setdefault(target.id, set()).update(types)

    def infer(self) -> None:
        """Types of names, to a fixed point (flow-insensitive, per file)."""
        for _ in range(4):
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                                and len(target.elts) == len(node.value.elts):  # a, b = x, y
                            for one, value in zip(target.elts, node.value.elts):
                                self.bind(one, self.type_of(value))
                        self.bind(target, self.type_of(node.value))
                elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                    self.bind(node.target, self.type_of(node.value))
                elif isinstance(node, (ast.For, ast.comprehension)):
                    self.bind(node.target, elements(self.type_of(node.iter)))
                elif isinstance(node, ast.arg) and node.annotation is not None:
                    self.bind(ast.Name(node.arg), annotation_types(node.annotation))

    def collect(self) -> set[str]:
        self.infer()
        self.visit(self.tree, [])
        return self.used

    def visit(self, node: ast.AST, scopes: list[dict[str, set[str]]]) -> None:
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            scopes = [*scopes, dicts_of(node)]
        name = self.public(node)
        if name is not None:
            self.used.add(name)
        if isinstance(node, ast.Call):
            self.call(node, scopes)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            for cls in self.type_of(node.value) & API.classes:
                if node.attr in API.reads[cls]:
                    self.used.add(f"{cls}.{node.attr} (read)")
        for child in ast.iter_child_nodes(node):
            self.visit(child, scopes)

    def call(self, node: ast.Call, scopes: list[dict[str, set[str]]]) -> None:
        callee = self.public(node.func)
        if callee is not None and callee in API.params:
            self.arguments(callee, node, scopes)
        elif isinstance(node.func, ast.Attribute):
            for cls in self.type_of(node.func.value) & API.classes:
                if node.func.attr in API.methods[cls]:
                    self.used.add(f"{cls}.{node.func.attr}()")
                    self.arguments(f"{cls}.{node.func.attr}", node, scopes)

    def arguments(self, callable_name: str, node: ast.Call, scopes: list[dict[str, set[str]]]) -> None:
        params = API.params[callable_name]
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        for param, arg in zip(positional, node.args):
            if isinstance(arg, ast.Starred):
                break
            self.used.add(f"{callable_name}.{param.name}")
        for kw in node.keywords:
            if kw.arg is not None:
                names = {kw.arg}
            elif isinstance(kw.value, ast.Name):  # the innermost function (or the module) that assigns it
                names = next((scope[kw.value.id] for scope in reversed(scopes) if kw.value.id in scope), set())
            else:
                names = dict_keys(kw.value) or set()
            self.used |= {f"{callable_name}.{n}" for n in names}


def dicts_of(scope: ast.AST) -> dict[str, set[str]]:
    """Names a scope (a module or a function, not the functions inside it) assigns a dict
    literal or ``dict(...)``: name -> its keys (several assignments: all their keys)."""
    out: dict[str, set[str]] = {}
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Assign) and dict_keys(node.value) is not None:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out.setdefault(target.id, set()).update(dict_keys(node.value) or set())
        todo.extend(ast.iter_child_nodes(node))
    return out


def elements(types: set[str]) -> set[str]:
    return {t.removeprefix("iter:") for t in types if t.startswith("iter:")}


def dict_keys(node: ast.AST) -> set[str] | None:
    """The string keys of a dict literal or a ``dict(k=...)`` call (nested ``**`` left out);
    None when ``node`` is neither."""
    if isinstance(node, ast.Dict):
        return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        return {kw.arg for kw in node.keywords if kw.arg is not None}
    return None


def api_test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.resolve() != Path(__file__).resolve())


def uses_of(path: Path) -> set[str]:
    uses = FileUses(ast.parse(path.read_text(), filename=str(path)))
    return uses.collect() if uses.imports_api else set()


def used_by_tests() -> dict[str, list[str]]:
    """Requirement -> the test files (relative to tests/) that meet it."""
    where: dict[str, list[str]] = {}
    for path in api_test_files():
        for item in uses_of(path):
            where.setdefault(item, []).append(str(path.relative_to(TESTS)))
    return where


# ------------------------------------------------------------------ the checks

def test_every_public_name_and_keyword_is_used_by_a_test():
    required = API.required()
    used = used_by_tests()
    missing = sorted(required - set(used))
    assert not missing, (f"{len(missing)} of {len(required)} parts of the public API are used by no test "
                         "(through `import trainfeed` / `from trainfeed import`):\n  " + "\n  ".join(missing))


def test_the_requirements_are_what_the_api_declares():
    """The check itself: it sees the parts of the API everyone knows are there."""
    required = API.required()
    assert set(RESULTS) <= API.classes
    for item in ("convert.format", "convert.src", "open_store.storage_options", "Store.batches()",
                 "Store.batches.seed", "TorchDataset.batch_size", "TorchDataset.set_epoch()",
                 "TorchDataset.epoch (read)", "tf_dataset.prefetch", "TrainConfig.data", "TrainConfig.store",
                 "OpenOptions.cache_dir", "EpochOptions.rank", "ForeignSchema.encoding",
                 "ConvertResult.samples (read)", "TrainResult.summary (read)", "Batch.x (read)",
                 "Batch.nbytes (read)", "Store.uri (read)",
                 "UsageError.exit_code (read)", "train.config", "__version__"):
        assert item in required, item
    assert "Store.reader" not in required and "ConvertResult.format" not in required  # results are not built


def test_the_matching_recognises_what_the_docstring_says():
    code = '''
import trainfeed
from trainfeed import TorchDataset as TD

common = dict(format="parquet", mode="overwrite")
r = trainfeed.convert("src", "dst", **common, **{"verify": True})
print(r.samples, trainfeed.ConvertResult.from_summary({}))
store = trainfeed.open_store("dst")
for b in store.batches(8, seed=1):
    print(b.ids)
first = next(iter(list(store.batches(drop_last=True))))
first.nbytes
ds, other = TD(store.uri, pool="arrow"), 1
ds.set_epoch(2)

def helper(s: trainfeed.Store, other):
    s.batches(rank=1)
    other.batches(world_size=2)    # unknown receiver: not counted
    trainfeed.Store.batches        # not a call
    opts = dict(cache_dir="c")

def another():
    trainfeed.open_store("y", **opts)  # another function's dict: not followed
'''
    uses = FileUses(ast.parse(code))
    got = uses.collect()
    want = {"convert", "convert.src", "convert.dst", "convert.format", "convert.mode", "convert.verify",
            "ConvertResult", "ConvertResult.samples (read)", "ConvertResult.from_summary()",
            "ConvertResult.from_summary.summary", "open_store", "open_store.uri", "Store.batches()",
            "Store.batches.batch_size", "Store.batches.seed", "Batch.ids (read)", "Store.batches.drop_last",
            "Batch.nbytes (read)", "TorchDataset", "TorchDataset.store", "TorchDataset.pool", "Store.uri (read)",
            "TorchDataset.set_epoch()", "TorchDataset.set_epoch.epoch", "Store", "Store.batches.rank"}
    assert got == want, (sorted(got - want), sorted(want - got))
