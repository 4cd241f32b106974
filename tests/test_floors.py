"""The floors, read from the imports: no import cycle between project modules, and no floor importing
one above it. Module-level, class-level and `if TYPE_CHECKING:` imports count; imports inside a
function (lazy imports, e.g. a CLI command's heavy dependencies) do not.

    kvstore primitives  <-  tiers/ | policies/ | gpu_kernels/  (independent of each other)
                        <-  kvstore/store/  <-  connector/  <-  service/  <-  kvstore/cli/

docs/ARCHITECTURE.md draws them and says what each folder holds.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvstore", "tiers", "policies", "gpu_kernels", "connector", "service", "bench")
PRIMITIVES = {"kvstore", "kvstore.errors", "kvstore.layout", "kvstore.hashing", "kvstore.chunk_format",
              "kvstore.types", "kvstore.units", "kvstore.config", "kvstore.registry", "kvstore.stats",
              "kvstore.bundled", "kvstore.where", "kvstore.redact", "kvstore.kv_scope", "kvstore.wire_types"}
PRIMITIVES |= {"kvstore.logs", "kvstore.config_origins"}  # log levels; where each config field came from


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _eager_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports outside function bodies (module level, class level, `if TYPE_CHECKING`, try)."""
    stack = [tree]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(max(0, node.level - 1)):
        base = base.rpartition(".")[0]
    source = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
    names = [f"{source}.{alias.name}" for alias in node.names]
    return [name if _resolve(name) == name else source for name in names] or [source]


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        found = edges.setdefault(module, set())
        for node in _eager_imports(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _targets(module, node):
                resolved = _resolve(target)
                if resolved is not None and resolved != module:
                    found.add(resolved)
    return edges


EDGES = _edges()


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (iterative Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def floor_of(module: str) -> str:
    if module in PRIMITIVES:
        return "primitives"
    parts = module.split(".")
    if parts[0] == "kvstore":
        return f"kvstore.{parts[1]}"  # kvstore.store, kvstore.cli, kvstore.sim, kvstore.plan, kvstore.cluster
    return parts[0]


def _violations(importer_floor: str, allowed: set[str]) -> list[str]:
    allowed = allowed | {importer_floor}
    return [f"{module} imports {target}" for module, targets in sorted(EDGES.items())
            if floor_of(module) == importer_floor for target in sorted(targets) if floor_of(target) not in allowed]


def test_the_parser_sees_the_project():
    assert "kvstore.store.tiered_store" in MODULES and "kvstore.cli.app" in MODULES
    assert "kvstore.store.index" in EDGES["kvstore.store.tiered_store"]
    assert "tiers.base" in EDGES["tiers.arena"]
    assert "kvstore.types" in EDGES["kvstore.store.host_plane"]  # module level
    assert "kvstore.store.mover" in EDGES["kvstore.store.host_plane"]  # under `if TYPE_CHECKING`
    assert "kvstore.store" not in EDGES["kvstore.cli.stats"]  # inside the command: lazy, not counted


def test_no_import_cycle_between_project_modules():
    assert _cycles(EDGES) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(("floor", "allowed"), [
    ("primitives", set()),
    ("tiers", {"primitives"}),
    ("policies", {"primitives"}),
    ("gpu_kernels", {"primitives"}),
    ("kvstore.store", {"primitives", "tiers", "policies", "gpu_kernels"}),
    ("connector", {"primitives", "tiers", "policies", "gpu_kernels", "kvstore.store"}),
    ("kvstore.sim", {"primitives", "policies", "kvstore.cluster"}),
    ("kvstore.cluster", {"primitives", "tiers", "kvstore.store"}),
    ("kvstore.plan", {"primitives", "tiers", "policies", "kvstore.store", "kvstore.sim"}),
    ("service", {"primitives", "tiers", "policies", "gpu_kernels", "kvstore.store", "kvstore.cluster", "connector"}),
])
def test_each_floor_imports_only_the_floors_below(floor, allowed):
    assert _violations(floor, allowed) == []


def test_connector_never_imports_service():
    assert [f"{m} imports {t}" for m, ts in EDGES.items() if floor_of(m) == "connector"
            for t in ts if floor_of(t) == "service"] == []


def test_nothing_below_the_cli_imports_it():
    assert [f"{m} imports {t}" for m, ts in EDGES.items() if floor_of(m) != "kvstore.cli"
            for t in ts if floor_of(t) == "kvstore.cli"] == []
