"""The import graph of specq (docs/architecture.md, "Import rules"): no circles, no upward imports,
no test tooling in production code, no private name imported from another module, and every
specq import names something that exists.

Read with `ast` over specq/**.py; nothing is imported. Counted: every import statement that runs,
at module level or inside a function (a lazy import is still an import), `from . import x`
included; not counted: imports under `if TYPE_CHECKING:`. An import of a parent package implied
by importing its child (Python runs specq/storage/__init__.py before specq/storage/jobs.py) is
not an edge: only what a statement names.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: each unit (a package or module, matched by the longest prefix) and the units it stands on: a
#: module may import its own unit and everything its unit stands on, directly or through them.
#: A module of no unit fails the test: a new module or package gets its place here.
LAYERS: dict[str, tuple[str, ...]] = {
    # the ground: names every layer shares
    "specq": (),  # the package itself (__version__)
    "specq.contracts": (),
    "specq.config": (),
    "specq.openai_format": (),
    "specq.ascii_numbers": (),  # numbers from outside text, ASCII digits only
    "specq.served_models": (),  # the model names a deployment answers to
    # the engine, bottom up (specq/engine/__init__.py)
    "specq.engine.json_schema": ("specq.contracts",),  # the JSON Schemas output can be constrained to
    "specq.engine.options": ("specq.contracts", "specq.engine.json_schema"),
    "specq.engine.result": ("specq.contracts",),
    "specq.engine.inputs": ("specq.contracts",),
    "specq.engine.models": ("specq.contracts", "specq.config"),
    "specq.engine.llama": ("specq.engine.options",),
    "specq.engine.cache": ("specq.contracts", "specq.engine.llama"),
    "specq.engine.policy": ("specq.engine.options", "specq.engine.cache", "specq.engine.models"),
    "specq.engine.prompt": ("specq.engine.llama",),
    "specq.engine.decode": ("specq.engine.prompt",),
    "specq.engine.scoring": ("specq.engine.decode",),
    "specq.engine.group_sparse": ("specq.engine.decode", "specq.engine.cache", "specq.engine.result"),
    "specq.engine.pipeline": ("specq.engine.scoring", "specq.engine.cache", "specq.engine.policy", "specq.engine.result",
                              "specq.engine.inputs", "specq.engine.models", "specq.engine.group_sparse"),
    "specq.engine.serving": ("specq.engine.pipeline",),
    "specq.engine": ("specq.engine.serving",),  # the package's own __init__ (a docstring)
    # test and benchmark tooling (and see TESTING_IMPORTERS)
    "specq.testing": ("specq.engine",),
    # the job store: knows no engine, no service around it
    "specq.storage": ("specq.contracts", "specq.config", "specq.openai_format"),
    # the service
    "specq.settings": ("specq.engine", "specq.storage"),
    "specq.settings_reference": ("specq.settings",),  # the configuration reference rendered from it
    "specq.broker": ("specq.settings",),
    "specq.monitor": ("specq.settings",),
    "specq.client": ("specq.settings",),
    "specq.reconciler": ("specq.broker",),
    "specq.worker": ("specq.reconciler", "specq.monitor"),
    "specq.bench": ("specq.engine", "specq.testing", "specq.settings_reference"),
    "specq.api": ("specq.broker", "specq.monitor"),
    "specq.cli": ("specq.api", "specq.worker", "specq.bench", "specq.client", "specq.reconciler"),
    "specq.__main__": ("specq.cli",),
}
#: units every module may import: the names every layer shares
GROUND = ("specq", "specq.contracts", "specq.config", "specq.openai_format", "specq.ascii_numbers", "specq.served_models")
#: the only modules that may import specq.testing (production code never does)
TESTING_IMPORTERS = ("specq.testing", "specq.bench", "specq.cli.bench")


def _module_files() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "specq").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _module_files()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(node: ast.AST):
    """Import statements under `node` that run (those under `if TYPE_CHECKING:` left out)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield from _runtime_imports(ast.Module(body=[stmt], type_ignores=[]))
        else:
            yield from _runtime_imports(child)


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))


@cache
def _top_names(module: str) -> frozenset[str] | None:
    """Names a module binds at its top level (None: a star import or `__getattr__` makes it open)."""
    names: set[str] = set()

    def visit(body):
        for stmt in body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(stmt.name)
            elif isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and isinstance(stmt.target, ast.Name):
                names.add(stmt.target.id)
            elif isinstance(stmt, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom):
                if any(a.name == "*" for a in stmt.names):
                    raise LookupError
                names.update(a.asname or a.name for a in stmt.names)
            elif isinstance(stmt, (ast.If, ast.Try, ast.With)):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(stmt, field, []))
                for h in getattr(stmt, "handlers", []):
                    visit(h.body)

    try:
        visit(_tree(module).body)
    except LookupError:
        return None
    return None if "__getattr__" in names else frozenset(names)


def _base(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    pkg = module.split(".") if MODULES[module].name == "__init__.py" else module.split(".")[:-1]
    pkg = pkg[: len(pkg) - (node.level - 1)]
    return ".".join(pkg + ([node.module] if node.module else []))


@cache
def graph() -> tuple[dict[str, set[str]], list[str], list[str]]:
    """(module -> the specq modules it imports at run time, unresolved imports, private names imported)."""
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    unresolved, private = [], []
    for module in MODULES:
        for node in _runtime_imports(_tree(module)):
            where = f"{MODULES[module].relative_to(ROOT)}:{node.lineno}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == "specq" or a.name.startswith("specq."):
                        if a.name in MODULES:
                            edges[module].add(a.name)
                        else:
                            unresolved.append(f"{where}: import {a.name}")
                continue
            base = _base(module, node)
            if not (base == "specq" or base.startswith("specq.")):
                continue
            if base not in MODULES:
                unresolved.append(f"{where}: from {base} import ...: no such module")
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    edges[module].add(sub)
                    continue
                edges[module].add(base)
                names = _top_names(base)
                if names is not None and a.name != "*" and a.name not in names:
                    unresolved.append(f"{where}: from {base} import {a.name}: {base} has no {a.name}")
                if a.name.startswith("_") and not a.name.startswith("__") and base != module:
                    private.append(f"{where}: from {base} import {a.name}")
        edges[module].discard(module)
    return edges, unresolved, private


def unit_of(module: str) -> str | None:
    best = None
    for unit in LAYERS:
        if module == unit or (unit != "specq" and module.startswith(unit + ".")):
            if best is None or len(unit) > len(best):
                best = unit
    return best


@cache
def allowed(unit: str) -> frozenset[str]:
    """The units `unit` may import: itself, the ground and everything below it."""
    out = {unit, *GROUND}
    for below in LAYERS[unit]:
        out |= allowed(below)
    return frozenset(out)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return found


def test_the_layer_table_is_itself_a_ladder():
    """Every unit named as ground is a unit, and no unit stands (through others) on itself."""
    for unit, below in LAYERS.items():
        assert all(b in LAYERS for b in below), (unit, below)
        assert not any(unit in allowed(b) for b in below), f"{unit} stands on itself"


def test_no_import_circles():
    found = circles(graph()[0])
    assert not found, "import circles (runtime imports, TYPE_CHECKING ones not counted):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_no_upward_imports():
    edges = graph()[0]
    homeless = sorted(m for m in MODULES if unit_of(m) is None)
    assert not homeless, f"modules in no unit of LAYERS (give each its place): {homeless}"
    bad = []
    for module, targets in sorted(edges.items()):
        mine = unit_of(module)
        for t in sorted(targets):
            theirs = unit_of(t)
            if theirs not in allowed(mine):
                bad.append(f"{module} ({mine}) imports {t} ({theirs})")
    assert not bad, "imports against the layers (docs/architecture.md):\n" + "\n".join(bad)


def test_production_code_never_imports_test_tooling():
    edges = graph()[0]
    bad = sorted(f"{m} imports {t}" for m, ts in edges.items() for t in ts
                 if (t == "specq.testing" or t.startswith("specq.testing."))
                 and not any(m == ok or m.startswith(ok + ".") for ok in TESTING_IMPORTERS))
    assert not bad, "specq.testing is for tests and benchmarks only:\n" + "\n".join(bad)


def test_no_private_names_across_modules():
    private = graph()[2]
    assert not private, "private names imported from another module (make what two modules share public):\n" + \
        "\n".join(private)


def test_every_specq_import_resolves():
    """A moved module leaves no import behind that only fails when its line first runs."""
    unresolved = graph()[1]
    assert not unresolved, "imports of specq modules or names that do not exist:\n" + "\n".join(unresolved)


def test_every_specq_import_of_tests_scripts_and_bench_resolves():
    """The same for the code around the package (absolute imports of specq only)."""
    unresolved = []
    for folder in ("tests", "scripts", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Import):
                    unresolved += [f"{where}: import {a.name}" for a in node.names
                                   if a.name.startswith("specq.") and a.name not in MODULES]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module and (
                        node.module == "specq" or node.module.startswith("specq.")):
                    if node.module not in MODULES:
                        unresolved.append(f"{where}: from {node.module} import ...: no such module")
                        continue
                    names = _top_names(node.module)
                    unresolved += [f"{where}: from {node.module} import {a.name}" for a in node.names
                                   if f"{node.module}.{a.name}" not in MODULES and names is not None
                                   and a.name != "*" and a.name not in names]
    assert not unresolved, "imports of specq modules or names that do not exist:\n" + "\n".join(unresolved)


def test_the_checks_see_what_they_claim(tmp_path):
    """The machinery on a made-up tree: a lazy import in a function is an edge, a TYPE_CHECKING one
    is not, and a two-module circle is found."""
    src = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n"
                    "def f():\n    from .c import Y\n")
    found = [n.module for n in _runtime_imports(src)]
    assert found == ["typing", "c"]
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert circles({"a": {"b"}, "b": set()}) == []
