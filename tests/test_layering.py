"""The project's layering, read statically from its own import statements.

Every ``.py`` file under the four packages is parsed (nothing is imported), and every import
counts: module-level ones and those inside functions (a function-level import is how a cycle
gets hidden), but not those under ``if TYPE_CHECKING:``, which never run. The generated gRPC
modules (``fastserve/proto/fastserve/``) are not the project's code and are left out.

Rules: no import cycle; no service module imports the CLI or the benchmarks; the KV store's
client does not reach the store's server; the scheduler core imports only itself and the
standard library; and no core file is over 450 lines.
"""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("fastserve", "scheduler_svc", "worker_svc", "kvstore_svc")
GENERATED = ROOT / "fastserve" / "proto" / "fastserve"
SERVICES = ("scheduler_svc", "worker_svc", "kvstore_svc")
CLI_PREFIXES = ("fastserve.cli", "fastserve.bench")
CORE = "scheduler_svc.core"
MAX_CORE_LINES = 450


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if GENERATED in path.parents:
                continue
            found[_module_name(path)] = path
    return found


SOURCES = _sources()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: anywhere in the tree, except the body of an
    ``if TYPE_CHECKING:`` (its ``else:`` branch runs, so it counts)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _imported_modules(module: str, path: Path) -> list[tuple[str, int]]:
    """(module name, line) for each module ``module`` imports, project or not.

    ``from a.b import c`` names ``a.b.c`` when that is a module of the project, else ``a.b``.
    """
    is_package = path.name == "__init__.py"
    out = []
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
            continue
        if node.level:  # relative: resolved against this module's package
            package = module.split(".") if is_package else module.split(".")[:-1]
            base = package[:len(package) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            out.append((sub if sub in SOURCES else target, node.lineno))
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[str, int]]]]:
    """Edges between project modules, and every module's full import list."""
    imports = {m: _imported_modules(m, p) for m, p in SOURCES.items()}
    edges = {m: {t for t, _ in imps if t in SOURCES and t != m} for m, imps in imports.items()}
    return edges, imports


EDGES, IMPORTS = _graph()


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as one
    cycle through it, e.g. ``[a, b, a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(edges) + 100))

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
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

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return [_cycle_through(c, edges) for c in sorted(components)]


def _path(start: str, goal: str, edges: dict[str, set[str]],
          within: set[str] | None = None) -> list[str] | None:
    """A shortest import path from ``start`` to ``goal`` (breadth first), or None."""
    previous: dict[str, str | None] = {start: None}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v]):
                if within is not None and w not in within:
                    continue
                if w == goal:
                    path = [w, v]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])  # type: ignore[arg-type]
                    return path[::-1]
                if w not in previous:
                    previous[w] = v
                    nxt.append(w)
        frontier = nxt
    return None


def _cycle_through(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    start = component[0]
    path = _path(start, start, edges, set(component))
    assert path is not None
    return path


def _line(module: str, target: str) -> str:
    lines = sorted({n for t, n in IMPORTS[module] if t == target})
    return f"{SOURCES[module].relative_to(ROOT)}:{','.join(map(str, lines))}"


def _describe(path: list[str]) -> str:
    hops = [f"{a} -> {b} ({_line(a, b)})" for a, b in itertools.pairwise(path)]
    return "\n    ".join(hops)


def test_the_walk_sees_the_project():
    assert {"fastserve.cli", "scheduler_svc.core.config", "worker_svc.server",
            "kvstore_svc.client"} <= set(SOURCES)
    assert not any(m.startswith("fastserve.proto.fastserve") for m in SOURCES)
    # function-level imports count: fastserve.cli imports its commands inside build_parser
    assert "fastserve.cli_serve" in EDGES["fastserve.cli"]


def test_type_checking_imports_do_not_count_and_function_imports_do():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "if TYPE_CHECKING:\n    import a\nelse:\n    import b\n"
        "if typing.TYPE_CHECKING:\n    import c\n"
        "def f():\n    import d\n"
        "class K:\n    def g(self):\n        from e import x\n")
    names = {alias.name if isinstance(n, ast.Import) else n.module
             for n in _import_nodes(tree) for alias in n.names}
    assert names == {"typing", "b", "d", "e"}


def test_cycle_finder_reports_a_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    cycles = _cycles(EDGES)
    assert not cycles, "import cycles:\n  " + "\n  ".join(_describe(c) for c in cycles)


def test_no_service_imports_the_cli_or_the_benchmarks():
    cli = {m for m in SOURCES if m.startswith(CLI_PREFIXES)}
    found = []
    for module in sorted(SOURCES):
        if not module.startswith(SERVICES):
            continue
        for target in sorted(cli):
            path = _path(module, target, EDGES)
            if path is not None:
                found.append(_describe(path))
                break
    assert not found, "service modules that reach the CLI:\n  " + "\n  ".join(found)


def test_the_store_client_does_not_reach_the_store_server():
    path = _path("kvstore_svc.client", "kvstore_svc.server", EDGES)
    assert path is None, "kvstore_svc.client reaches kvstore_svc.server:\n    " + _describe(path)


def test_the_core_imports_only_itself_and_the_standard_library():
    stdlib = set(sys.stdlib_module_names)
    found = []
    for module in sorted(m for m in SOURCES if m == CORE or m.startswith(CORE + ".")):
        for target, line in IMPORTS[module]:
            inside = target == CORE or target.startswith(CORE + ".")
            if not inside and target.split(".")[0] not in stdlib:
                found.append(f"{SOURCES[module].relative_to(ROOT)}:{line}: {target}")
    assert not found, "the core imports outside itself and the standard library:\n  " + \
        "\n  ".join(found)


def test_no_core_file_is_over_450_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "scheduler_svc/core").rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_CORE_LINES}
    assert not long, f"over {MAX_CORE_LINES} lines: {long}"
