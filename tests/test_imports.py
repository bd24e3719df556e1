"""Layering: no import cycles between the modules of zoo, export and serve (zoo/DESIGN.md §7: `layers/` is a leaf
that `models/` depends on).

The graph is built from the source, not by importing: every module's module-level `import` / `from … import`
statements (also inside a module-level `if`/`try`/`with`/class body, which run at import time, and under
`if TYPE_CHECKING:` — a circle through annotations alone is still two modules that each need the other, issue 87;
not inside functions), relative imports resolved. `from pkg import name` is an edge to `pkg.name` when
that is a module, else to `pkg`. Importing a submodule also runs its parent packages' `__init__`, but those implicit
edges are left out: a package's `__init__` importing its own submodules, which import each other, is the normal
layout. Modules are enumerated with pkgutil's module finder over the package directories — the same walk as
`pkgutil.walk_packages` (cross-checked below), minus its importing of every package, so a cycle that breaks
importing is still named here rather than silently skipped.

The runtime (`export.runtime`) is the ground floor: below, tests check that nothing in it imports above it (read
from all of its source, function bodies included), that the `export` package imports only it, that the Triton
models import nothing else of the project, and that importing it in a fresh interpreter loads no torch, zoo,
exporter or onnxruntime.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("zoo", "export", "serve")


def _walk(directory: Path, prefix: str) -> dict[str, Path]:
    """pkgutil.walk_packages without the imports: submodules and subpackages of one package directory."""
    found: dict[str, Path] = {}
    for info in pkgutil.iter_modules([str(directory)], prefix):
        leaf = info.name.rpartition(".")[2]
        if info.ispkg:
            found[info.name] = directory / leaf / "__init__.py"
            found.update(_walk(directory / leaf, f"{info.name}."))
        else:
            found[info.name] = directory / f"{leaf}.py"
    return found


def package_modules() -> dict[str, Path]:
    """Every module of PACKAGES: dotted name -> source file."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
        assert spec is not None and spec.origin is not None, package
        modules[package] = Path(spec.origin)
        modules.update(_walk(Path(spec.origin).parent, f"{package}."))
    for name, path in modules.items():
        assert path.is_file(), (name, path)
    return modules


def _import_time_statements(body: list[ast.stmt]):
    """Import statements at module level (descends into if — TYPE_CHECKING too — try and with, not into defs)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _import_time_statements(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _import_time_statements(node.body)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of `modules` it imports at module level."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _import_time_statements(ast.parse(path.read_text(encoding="utf-8"), str(path)).body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:  # relative: `from . import x` in a package is relative to the package itself
                    parts = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(parts[: len(parts) - (node.level - 1)])
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]
            for target in targets:
                # `import a.b.c` binds a but runs a.b.c; the edge goes to the most specific module we know
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a closed path a -> … -> a) per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def strongconnect(v: str) -> None:  # Tarjan; the graph has ~150 nodes, recursion depth is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # shortest path start -> … -> start inside the component (BFS), to name one concrete cycle
        parents: dict[str, str] = {}
        frontier = [start]
        found = None
        while frontier and found is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph[v] & members):
                    if w == start:
                        found = v
                        break
                    if w not in parents:
                        parents[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            frontier = nxt
        path = [start]
        v = found
        while v is not None and v != start:
            path.insert(1, v)
            v = parents.get(v)
        cycles.append([*path, start])
    return cycles


def test_graph_builder_sees_cycles() -> None:
    """The checker itself: a two-module cycle and a longer one are named, an acyclic graph passes."""
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
    assert find_cycles({"x": {"y"}, "y": {"z"}, "z": {"x"}, "w": {"x"}}) == [["x", "y", "z", "x"]]


def test_every_module_is_walked() -> None:
    modules = package_modules()
    walked = set(PACKAGES)
    for package in PACKAGES:
        root = Path(importlib.util.find_spec(package).origin).parent  # type: ignore[union-attr, arg-type]
        walked |= {info.name for info in pkgutil.walk_packages([str(root)], f"{package}.", onerror=_raise)}
    assert set(modules) == walked
    for name in (
        "zoo.flops",
        "zoo.attention.base",
        "zoo.attention.mgk",
        "export.runtime",
        "serve.ngc",
        "serve.repository",
    ):
        assert name in modules
    graph = import_graph(modules)
    assert "zoo.attention" in graph["zoo.flops"]
    assert "zoo.attention.base" in graph["zoo.attention.mgk"]
    assert "zoo.flops" not in graph["zoo.attention.mgk"]


def _raise(name: str) -> None:
    raise ImportError(f"pkgutil.walk_packages could not import {name}")


def test_no_import_cycles() -> None:
    cycles = find_cycles(import_graph(package_modules()))
    assert not cycles, "module-level import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("module", ["zoo.flops", "serve.ngc"])
def test_module_imports_in_a_fresh_interpreter(module: str) -> None:
    """Importing the module first (nothing else loaded) must work: a cycle hidden behind import order fails here."""
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("module", ["zoo.data.debian", "serve.proxy", "serve.bench.perf_analyzer"])
def test_debian_fetcher_loads_no_torch(module: str) -> None:
    """Serving fetches nginx (serve.proxy) and perf_analyzer's libb64 through zoo.data's Debian fetcher; on a
    serving host that must not load torch (seconds of start-up, and a serving host may not have it)."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", f"importing {module} loaded torch: {proc.stdout.strip()}"


# ------------------------------------------------------------------------------------------- the runtime's floor
RUNTIME = "export.runtime"


def _absolute_imports(path: Path, name: str) -> list[str]:
    """Every module `path` (module `name`) imports anywhere in its source — at the top, inside functions, under
    TYPE_CHECKING — as absolute dotted names (relative imports resolved)."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                source = f"{base}.{node.module}" if node.module else base
            found += [f"{source}.{alias.name}" for alias in node.names]  # `from pkg import name`: name may be a module
    return found


def _project_imports(path: Path, name: str) -> list[str]:
    return [m for m in _absolute_imports(path, name) if m.split(".")[0] in PACKAGES]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_the_runtime_is_the_ground_floor() -> None:
    """Layering's bottom (zoo/DESIGN.md §2): no module of export.runtime imports anything of zoo, serve or the rest
    of export — not even inside a function — and the `export` package itself imports only its runtime, so zoo,
    the exporter, serve and the Triton model directory (a copy of both) can all import it downward."""
    modules = package_modules()
    runtime = {name: path for name, path in modules.items() if _within(name, RUNTIME)}
    assert len(runtime) >= 10, sorted(runtime)
    upward = {
        (name, target)
        for name, path in runtime.items()
        for target in _project_imports(path, name)
        if not _within(target, RUNTIME)
    }
    assert not upward, f"the runtime imports above itself: {sorted(upward)}"
    package = _project_imports(modules["export"], "export")
    assert package and all(_within(t, RUNTIME) or t == "export.runtime" for t in package), package
    # and the layers above do import it (the direction is downward, not absent)
    graph = import_graph(modules)
    for above in ("zoo.data.tokenizer", "zoo.decoding.generate", "export.exporter", "serve.model_config"):
        assert any(_within(t, RUNTIME) for t in graph[above]), above


def test_triton_models_import_only_the_runtime_of_the_project() -> None:
    """The Python-backend models (serve/triton/, copied into model directories with the `export` package) import
    the runtime like any caller, and nothing else of the project: no zoo, no serve, no exporter, no torch."""
    files = sorted((REPO / "serve" / "triton").glob("*.py"))
    assert len(files) >= 5, files
    for path in files:
        imported = _absolute_imports(path, path.stem)
        assert not [m for m in imported if m.split(".")[0] in ("torch", "zoo", "serve")], (path.name, imported)
        ours = [m for m in imported if m.split(".")[0] == "export"]
        assert all(_within(m, RUNTIME) for m in ours), (path.name, ours)


def test_importing_the_runtime_runs_nothing_above_it() -> None:
    """A fresh `import export.runtime` (what the served models and a serving host do) loads no torch, no zoo, no
    exporter and no onnxruntime (sessions import it when they are made); and the torch commands that take the
    runtime's search types (zoo.train, zoo.decoding.generate, zoo.decoding.evaluation) never load onnxruntime with
    them."""
    code = (
        "import sys\n"
        "def loaded(*roots):\n"
        "    return sorted(m for m in sys.modules if m.split('.')[0] in roots or m.startswith('export.exporter'))\n"
        "import export.runtime\n"
        "print(loaded('torch', 'zoo', 'serve', 'onnxruntime', 'onnx', 'hydra'))\n"
        "import zoo.train, zoo.decoding.generate, zoo.decoding.evaluation\n"
        "print(loaded('onnxruntime'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["[]", "[]"], proc.stdout


LAB = ("export.bench", "serve.bench")  # measurement beside the product (zoo/DESIGN.md §7)


def test_the_product_imports_nothing_from_the_lab() -> None:
    """export/ and serve/ read as what they ship: no module of theirs outside export.bench / serve.bench imports
    one inside (the lab imports the product, and zoo.report / zoo.devtools run the lab, never the reverse)."""
    graph = import_graph(package_modules())
    assert all(lab in graph for lab in LAB)
    product = [m for m in graph if m.split(".")[0] in ("export", "serve") and not any(_within(m, lab) for lab in LAB)]
    leaks = sorted(f"{m} -> {t}" for m in product for t in graph[m] if any(_within(t, lab) for lab in LAB))
    assert not leaks, "the product imports the lab:\n" + "\n".join(leaks)
    lazy = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for m, path in package_modules().items()
        if m in product
        for line in path.read_text(encoding="utf-8").splitlines()
        if "import" in line and any(lab in line for lab in LAB)
    ]
    assert not lazy, "the product imports the lab inside a function:\n" + "\n".join(lazy)
