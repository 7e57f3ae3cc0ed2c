"""The import rules of docs/ARCHITECTURE.md, checked on the source with ``ast`` (no module is imported).

Every ``import`` counts, at module level or inside a function (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ARCHITECTURE = Path(__file__).resolve().parents[1] / "docs" / "ARCHITECTURE.md"
FRAMEWORKS = ("tensorflow", "torch", "lightning", "keras", "jax")
ADAPTERS = ("fitprof.keras", "fitprof.lightning", "fitprof.profilers")
"""The only places a framework may be imported: the two callbacks and the profiler modules."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(SRC.joinpath("fitprof").rglob("*.py"))}


def _import_nodes(name: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Each import statement of module ``name``, with the absolute module it imports from (a relative
    ``from . import`` resolved against the module's package; ``""`` for a plain ``import``)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield node, ""
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield node, base


def _imports(name: str) -> set[str]:
    """Every module ``name`` imports: ``from a import b`` counts as ``a.b`` when that is a fitprof module."""
    out: set[str] = set()
    for node, base in _import_nodes(name):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        else:
            for alias in node.names:
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return out


GRAPH = {name: _imports(name) for name in MODULES}


def _inside(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_the_modules_are_found() -> None:
    assert {"fitprof", "fitprof.analysis", "fitprof.fit.engine", "fitprof.cli", "fitprof.traces"} <= set(MODULES)


@pytest.mark.parametrize("name", [m for m in MODULES if not _inside(m, ADAPTERS)])
def test_the_core_imports_no_framework(name: str) -> None:
    found = {i for i in GRAPH[name] if i.split(".")[0] in FRAMEWORKS}
    assert not found, f"{name} imports {sorted(found)}; only {ADAPTERS} may import a framework"


@pytest.mark.parametrize("name", [m for m in MODULES if _inside(m, ("fitprof.cli",))])
def test_the_cli_imports_no_adapter(name: str) -> None:
    found = {i for i in GRAPH[name] if _inside(i, ADAPTERS)}
    assert not found, f"{name} imports {sorted(found)}"


MCP_SDK = ("mcp", "mcp_types")
MCP_SERVER = "fitprof.cli._mcp_server"
"""The one module that may import the MCP SDK, an optional extra (``fitprof mcp`` imports it only to serve)."""


@pytest.mark.parametrize("name", [m for m in MODULES if m != MCP_SERVER])
def test_only_the_mcp_server_imports_the_mcp_sdk(name: str) -> None:
    found = {i for i in GRAPH[name] if i.split(".")[0] in MCP_SDK}
    assert not found, f"{name} imports {sorted(found)}; only {MCP_SERVER} may import the MCP SDK"


def test_the_mcp_server_is_the_module_that_imports_the_sdk() -> None:
    """The rule above stands on a module that exists and does import the SDK (a rename would void it)."""
    assert {i.split(".")[0] for i in GRAPH[MCP_SERVER]} >= set(MCP_SDK)


@pytest.mark.parametrize("name", [m for m in MODULES if _inside(m, ("fitprof.traces",))])
def test_the_readers_import_only_the_table_and_file_names(name: str) -> None:
    """Readers produce the event table and never look at what the analysis makes of it."""
    found = {
        i for i in GRAPH[name] if i.startswith("fitprof") and not _inside(i, ("fitprof.traces", "fitprof._session"))
    }
    assert not found, f"{name} imports {sorted(found)}; traces may import only fitprof.traces and fitprof._session"


def _private_names_imported(name: str) -> set[str]:
    """The ``_private`` names (not modules) that ``name`` imports from other fitprof modules."""
    out: set[str] = set()
    for node, base in _import_nodes(name):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                full = f"{base}.{alias.name}"
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if base.startswith("fitprof") and private and full not in MODULES:
                    out.add(full)
    return out


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_another_modules_private_names(name: str) -> None:
    """What two modules share (the readers' Kineto rules, ...) lives in a module of its own, under public names."""
    found = _private_names_imported(name)
    assert not found, f"{name} imports private names {sorted(found)}; move what is shared into a module of its own"


def test_no_import_cycle_between_fitprof_modules() -> None:
    internal = {name: {i for i in deps if i in MODULES and i != name} for name, deps in GRAPH.items()}
    # A module imports its package's __init__ as a side effect of being imported; only explicit edges count.
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in sorted(internal[node]):
            if state.get(dep) == 1:
                cycles.append([*trail[trail.index(dep) :], dep] if dep in trail else [node, dep])
            elif dep not in state:
                visit(dep, [*trail, dep])
        state[node] = 2

    for name in sorted(internal):
        if name not in state:
            visit(name, [name])
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize(
    "name", [m for m in MODULES if _inside(m, ("fitprof.profilers", "fitprof.traces", "fitprof.analysis"))]
)
def test_the_layers_below_the_engine_never_import_it(name: str) -> None:
    """The profilers, the readers and the analysis sit below ``fitprof.fit``: no arrow climbs back up."""
    found = sorted(i for i in GRAPH[name] if _inside(i, ("fitprof.fit",)))
    assert not found, f"{name} imports {found}"


def test_the_epoch_end_goes_one_way() -> None:
    """The engine builds one result and hands it to one publisher: the publisher, the window pipeline and the
    triggered windows' bookkeeping never call one another."""
    rooms = ("fitprof.fit.publishing", "fitprof.fit.pipeline", "fitprof.fit.triggered")
    assert {room: sorted(set(GRAPH[room]) & set(rooms)) for room in rooms} == {room: [] for room in rooms}


def test_the_adapters_reach_the_engine_only_through_its_events() -> None:
    """No adapter compares a boundary string or reaches into the engine's epoch-parts probe."""
    src = Path(__file__).parent.parent / "src" / "fitprof"
    for path in src.rglob("*.py"):
        text = path.read_text()
        assert "boundary ==" not in text and "boundary !=" not in text, path
        if path.parent.name in ("keras", "lightning"):
            assert "engine.parts" not in text, path


def test_the_module_map_lists_every_module() -> None:
    """docs/ARCHITECTURE.md has one line per module, each naming what it may import."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.]+)` \|", text, flags=re.MULTILINE))
    assert listed == set(MODULES), f"missing: {sorted(set(MODULES) - listed)}, stale: {sorted(listed - set(MODULES))}"


def test_the_module_map_matches_the_imports() -> None:
    """Every fitprof module a module imports is in the "may import" column of its line."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    allowed: dict[str, set[str]] = {}
    for name, may in re.findall(r"^\| `([\w.]+)` \|[^|]*\|([^|]*)\|", text, flags=re.MULTILINE):
        allowed[name] = set(re.findall(r"`([\w.]+)`", may))
    wrong = {}
    for name, deps in GRAPH.items():
        used = {d for d in deps if d in MODULES and d != name}
        # A listed package allows its modules; the root package `fitprof` allows only itself.
        may = allowed.get(name, set())
        extra = {d for d in used if not any(d == a or (a != "fitprof" and d.startswith(a + ".")) for a in may)}
        if extra:
            wrong[name] = sorted(extra)
    assert not wrong, f"imports not in docs/ARCHITECTURE.md: {wrong}"


BACKEND_NAMES = {"tensorflow", "jax", "torch"}


def _backend_comparisons(path: Path) -> list[int]:
    """The lines of ``path`` that compare a value with a Keras backend's name (``x == "torch"``, ``x in ("jax",)``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            values = [node.left, *node.comparators]
            consts = [v for v in values if isinstance(v, ast.Constant)]
            consts += [e for v in values if isinstance(v, (ast.Tuple, ast.List, ast.Set)) for e in v.elts]
            if any(isinstance(c, ast.Constant) and c.value in BACKEND_NAMES for c in consts):
                lines.append(node.lineno)
    return lines


def test_the_keras_adapter_chooses_its_backend_from_the_table() -> None:
    """The backend is chosen once (``keras/_backends.py``); what differs between backends is a field of its row, so
    the package compares backend names in a few places only: the strategy checks of ``_distributed.py`` and the
    torch-only conv dtype."""
    found = {
        f"{p.relative_to(SRC)}:{line}"
        for p in sorted((SRC / "fitprof" / "keras").glob("*.py"))
        if p.name != "_backends.py"
        for line in _backend_comparisons(p)
    }
    assert len(found) <= 4, sorted(found)
