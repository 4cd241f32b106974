"""The floors, read from the imports: no import cycle between project modules or between floors, and no
floor importing one above it. Every import counts, wherever it is written (module level, class level,
`if TYPE_CHECKING:`, inside a function): a lazy import is still a dependency. The one exception is the
CLI's commands (kvstore/cli/), which import their heavy dependencies inside the command function; the
CLI may import anything, and nothing imports it.

    kvstore primitives  <-  tiers/ | policies/ | gpu_kernels/  (independent of each other)
                        <-  kvstore/store/  <-  connector/  <-  service/  <-  bench/  <-  kvstore/cli/

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
              "kvstore.types", "kvstore.units", "kvstore.flags", "kvstore.config", "kvstore.registry", "kvstore.stats",
              "kvstore.bundled", "kvstore.where", "kvstore.redact", "kvstore.kv_scope", "kvstore.wire_types",
              "kvstore.preflight"}
PRIMITIVES |= {"kvstore.logs", "kvstore.config_origins"}  # log levels; where each config field came from
PRIMITIVES |= {"kvstore.config_convert", "kvstore.config_env"}  # config tables to dataclasses; file + env layers
PRIMITIVES |= {"kvstore.capacity_caps"}  # a tier started below its configured capacity at a restart
PRIMITIVES |= {"kvstore.native_keys"}  # the C build of the chunk-key loops, kvstore.hashing's twin
PRIMITIVES |= {"kvstore.key_table"}  # compact maps for per-chunk records (KeyTable; KeyIndex from the C build)
PRIMITIVES |= {"kvstore.kv_events"}  # vLLM's KV event wire types (the daemon publishes, connectors may too)
PRIMITIVES |= {"kvstore.breaker"}  # the one breaker: the connector's store calls and the Redis tier
CLI = "kvstore.cli"


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


def _imports(tree: ast.AST, *, in_functions: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import of a module; without `in_functions`, only those outside function bodies."""
    stack = [tree]
    while stack:
        for child in ast.iter_child_nodes(stack.pop()):
            if not in_functions and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
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
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _imports(tree, in_functions=floor_of(module) != CLI):
            for target in _targets(module, node):
                resolved = _resolve(target)
                if resolved is not None and resolved != module:
                    found.add(resolved)
    return edges




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


EDGES = _edges()


def _floor_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph one level up: floor -> the floors its modules import."""
    floors: dict[str, set[str]] = {}
    for module, targets in edges.items():
        floors.setdefault(floor_of(module), set()).update(floor_of(target) for target in targets)
    for floor, targets in floors.items():
        targets.discard(floor)
        for target in targets:
            floors.setdefault(target, set())
    return floors


def _violations(importer_floor: str, allowed: set[str]) -> list[str]:
    allowed = allowed | {importer_floor}
    return [f"{module} imports {target}" for module, targets in sorted(EDGES.items())
            if floor_of(module) == importer_floor for target in sorted(targets) if floor_of(target) not in allowed]


FLOOR_RULES = {
    "primitives": set(),
    "tiers": {"primitives"},
    "policies": {"primitives"},
    "gpu_kernels": {"primitives"},
    "kvstore.store": {"primitives", "tiers", "policies", "gpu_kernels"},
    "connector": {"primitives", "tiers", "policies", "gpu_kernels", "kvstore.store"},
    "kvstore.sim": {"primitives", "policies", "kvstore.cluster"},
    "kvstore.cluster": {"primitives", "tiers", "kvstore.store"},
    "kvstore.plan": {"primitives", "tiers", "policies", "kvstore.store", "kvstore.sim"},
    "service": {"primitives", "tiers", "policies", "gpu_kernels", "kvstore.store", "kvstore.cluster", "connector"},
    "bench": {"primitives", "tiers", "policies", "gpu_kernels", "kvstore.store", "kvstore.cluster", "kvstore.sim",
              "kvstore.plan", "connector", "service"},
    CLI: {"primitives", "tiers", "policies", "gpu_kernels", "kvstore.store", "kvstore.cluster", "kvstore.sim",
          "kvstore.plan", "connector", "service", "bench"},
}


def test_the_parser_sees_the_project() -> None:
    assert "kvstore.store.tiered_store" in MODULES and "kvstore.cli.app" in MODULES
    assert "kvstore.store.index" in EDGES["kvstore.store.tiered_store"]
    assert "tiers.base" in EDGES["tiers.arena"]
    assert "kvstore.hashing" in EDGES["kvstore.store.reads"]  # module level
    assert "kvstore.store.mover" in EDGES["kvstore.store.reads"]  # under `if TYPE_CHECKING`
    assert "kvstore.store" in EDGES["connector.plugin_store"]  # inside a function: counted
    assert "kvstore.store" not in EDGES["kvstore.cli.stats"]  # inside a CLI command: lazy, not counted


def test_every_module_belongs_to_a_floor_with_a_rule() -> None:
    """A new top-level kvstore module or package gets a floor here (and in docs/ARCHITECTURE.md)."""
    assert sorted({floor_of(module) for module in MODULES} - set(FLOOR_RULES)) == []


def test_no_import_cycle_between_project_modules() -> None:
    assert _cycles(EDGES) == []


def test_no_import_cycle_between_floors() -> None:
    """Two floors importing each other (kvstore/sim and kvstore/plan once did) have no order."""
    assert _cycles(_floor_edges(EDGES)) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles(_floor_edges({"kvstore.sim.suite": {"kvstore.plan.workload"}, "kvstore.plan.workload": set(),
                                 "kvstore.plan.capacity": {"kvstore.sim.replay"}, "kvstore.sim.replay": set()})) \
        == [["kvstore.plan", "kvstore.sim"]]


@pytest.mark.parametrize(("floor", "allowed"), sorted(FLOOR_RULES.items()))
def test_each_floor_imports_only_the_floors_below(floor: str, allowed: set[str]) -> None:
    assert _violations(floor, allowed) == []


def test_connector_never_imports_service() -> None:
    assert [f"{m} imports {t}" for m, ts in EDGES.items() if floor_of(m) == "connector"
            for t in ts if floor_of(t) == "service"] == []


def test_nothing_below_the_cli_imports_it() -> None:
    assert [f"{m} imports {t}" for m, ts in EDGES.items() if floor_of(m) != CLI
            for t in ts if floor_of(t) == CLI] == []


def test_only_the_cli_imports_bench() -> None:
    """bench/ measures the project; the project never depends on it (tests may use its data makers)."""
    assert [f"{m} imports {t}" for m, ts in EDGES.items() if floor_of(m) not in (CLI, "bench")
            for t in ts if floor_of(t) == "bench"] == []
