"""The house holds: every module sits in one wing, a wing imports only the wings the table below
allows, the imports form no cycle, pure modules touch no store, and faces use public names only.

Parsed from the source (imports, attribute accesses), over every module of every sub-package, so
it cannot drift as modules move. Module size is not checked: a module is as long as its concern.
"""

from __future__ import annotations

import ast
import importlib
import json
from collections.abc import Iterator
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hybridmem"

#: Top-level modules, by the floor they stand on. Every other module's wing is its folder.
TOP_LEVEL = {
    "hybridmem": "package",  # the public names (Memory and AsyncMemory imported lazily)
    "hybridmem.config": "ground", "hybridmem.errors": "ground", "hybridmem.models": "ground",
    "hybridmem.filters": "ground", "hybridmem.text": "ground", "hybridmem.protocols": "ground",
    "hybridmem.prompts": "ground", "hybridmem.observe": "ground",
    "hybridmem.stores": "stores",
    "hybridmem.offline": "endpoints", "hybridmem.openai_compat": "endpoints",
    "hybridmem.backends": "assembly", "hybridmem.memory": "assembly", "hybridmem.aio": "assembly",
    "hybridmem.mcp": "faces", "hybridmem.langgraph": "faces",
}
#: wing -> the wings it may import (besides itself and the ground floor). Read bottom-up: a wing
#: appears here only after every wing it imports.
ALLOWED: dict[str, set[str]] = {
    "ground": set(),
    "runtime": set(),
    "endpoints": set(),
    "extract": set(),
    "sqlite": {"runtime"},
    "chroma": {"runtime"},
    "graph": {"runtime", "sqlite"},
    "replica": {"runtime", "sqlite", "chroma", "graph"},
    "stores": {"runtime"},
    "read": {"runtime", "stores", "graph"},
    "write": {"runtime", "stores", "graph", "read"},
    "ops": {"runtime", "stores", "sqlite", "chroma", "graph"},
    "assembly": {"runtime", "stores", "endpoints", "extract", "sqlite", "chroma", "graph",
                 "replica", "read", "write", "ops"},
    "package": {"assembly"},
    "faces": {"package"},  # and, per the test below, only public names
    "server": {"package"},
    "cli": {"package", "faces", "server"},
}
#: Modules that decide or compute, and touch no storage or network.
PURE = {"hybridmem.text", "hybridmem.filters", "hybridmem.models", "hybridmem.errors",
        "hybridmem.read.ranking", "hybridmem.read.context", "hybridmem.write.policy",
        "hybridmem.write.episodes", "hybridmem.graph.resolve"}
THIRD_PARTY_IO = {"chromadb", "networkx", "sqlite3", "openai", "onnxruntime", "httpx", "filelock"}
#: What the faces (CLI, server, MCP, LangGraph, bench, notebooks) may import from hybridmem: the
#: package, the value and error modules, the server factory, and the parts a user may hand to
#: Memory — each only by the names its ``__all__`` lists.
FACE_MODULES = {"hybridmem", "hybridmem.models", "hybridmem.config", "hybridmem.errors",
                "hybridmem.text", "hybridmem.offline", "hybridmem.observe", "hybridmem.server",
                "hybridmem.cli",
                "hybridmem.mcp", "hybridmem.graph", "hybridmem.extract",
                "hybridmem.sqlite.lexical", "hybridmem.graph.name_vectors",
                "hybridmem.write.policy", "hybridmem.chroma.vector"}
#: Inside a multi-module face, its own modules are its own business.
FACE_PACKAGES = {"hybridmem.cli", "hybridmem.server"}


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _wing(module: str) -> str:
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    parts = module.split(".")
    assert len(parts) >= 3 or (PACKAGE / parts[-1]).is_dir(), f"{module} has no wing in the table"
    return parts[1]


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import in the tree, lazy ones too."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield base, alias.name


def _edges() -> Iterator[tuple[str, str]]:
    """(importer, imported) between our own modules; ``from pkg import module`` names the module."""
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for base, name in _imports(tree, module, path.name == "__init__.py"):
            target = f"{base}.{name}" if name and f"{base}.{name}" in MODULES else base
            if target in MODULES and target != module:
                yield module, target


def test_every_module_has_a_wing_in_the_table() -> None:
    wings = {_wing(m) for m in MODULES}
    assert wings <= set(ALLOWED), wings - set(ALLOWED)
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders <= set(ALLOWED), folders - set(ALLOWED)


def test_wings_import_only_the_wings_below_them() -> None:
    upward = []
    for importer, imported in _edges():
        src, dst = _wing(importer), _wing(imported)
        if dst not in {src, "ground"} | ALLOWED[src]:
            upward.append(f"{importer} ({src}) imports {imported} ({dst})")
    assert upward == []


def test_the_table_itself_has_no_cycle() -> None:
    graph = nx.DiGraph([(w, d) for w, deps in ALLOWED.items() for d in deps])
    assert nx.is_directed_acyclic_graph(graph), list(nx.simple_cycles(graph))


def test_modules_import_one_another_without_cycles() -> None:
    graph = nx.DiGraph(list(_edges()))
    assert list(nx.simple_cycles(graph)) == []


def test_the_guard_sees_every_sub_package() -> None:
    """The walk reaches into folders (a glob of the top level alone would pass an empty house)."""
    assert {"hybridmem.chroma.vector", "hybridmem.write.writer", "hybridmem.read.retrieval",
            "hybridmem.graph.store"} <= set(MODULES)
    assert sum(1 for m in MODULES if m.count(".") >= 2) > 30


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_import_no_store(name: str) -> None:
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for module, _ in _imports(tree, name, path.name == "__init__.py"):
        top = module.split(".")[0]
        assert top not in THIRD_PARTY_IO, f"{name} imports {module}"
        if top == "hybridmem" and module in MODULES:
            assert module in PURE or _wing(module) == "ground", f"pure module {name} imports {module}"


def _face_sources() -> Iterator[tuple[str, str, str]]:
    """(label, module the source counts as, source) of every face."""
    for module, path in MODULES.items():
        if _wing(module) in {"faces", "cli", "server"}:
            yield str(path.relative_to(ROOT)), module, path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "bench").glob("*.py")):
        yield f"bench/{path.name}", "bench", path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        yield f"notebooks/{path.name}", "notebook", "\n".join(
            line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))
        )


@pytest.mark.parametrize("face,module,source", list(_face_sources()), ids=lambda v: str(v)[:40])
def test_faces_use_public_names_only(face: str, module: str, source: str) -> None:
    tree = ast.parse(source)
    own = next((p for p in FACE_PACKAGES if module.startswith(p + ".") or module == p), None)
    for imported, name in _imports(tree, module, face.endswith("__init__.py")):
        if imported.split(".")[0] != "hybridmem" or (own and imported.startswith(own + ".")):
            continue
        assert imported in FACE_MODULES, f"{face} imports the internal module {imported}"
        if name is not None:
            exported = importlib.import_module(imported).__all__
            assert name in exported, f"{face} imports {imported}.{name}, which is not public"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not (
            node.attr.startswith("__") and node.attr.endswith("__")
        ):
            owner = node.value.id if isinstance(node.value, ast.Name) else ""
            assert owner in {"self", "cls", "sys"}, (
                f"{face} line {node.lineno} reaches into a private attribute .{node.attr}"
            )


def test_memory_holds_its_stores_privately() -> None:
    from hybridmem import Memory

    public = {n for n in dir(Memory) if not n.startswith("_")}
    assert not public & {"vectors", "lexical", "history_store", "weights"}
    assert callable(Memory.graph)  # a method that returns a copy, never the graph store
