"""The layout holds: pure modules import no store, faces use public names only, no module grows
past 600 lines. Parsed from the source (imports and attribute accesses), so it cannot drift."""

from __future__ import annotations

import ast
import importlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hybridmem"
#: Modules that decide or compute, and touch no storage or network.
PURE = {"text", "filters", "models", "errors", "ranking", "context", "policy", "episodes"}
#: Modules that hold a backend (files, Chroma, SQLite) or speak to one.
STORES = {"vector", "graph", "lexical", "shared", "history", "_sqlite", "_chroma", "_graphio",
          "_files", "backends", "openai_compat", "offline"}
THIRD_PARTY_IO = {"chromadb", "networkx", "sqlite3", "openai", "onnxruntime", "httpx", "filelock"}
#: What the faces (CLI, server, bench, notebooks) may import from hybridmem: the package, the
#: value and error modules, the server factory, and the backends a user may hand to Memory —
#: each only by the names its ``__all__`` lists.
FACE_MODULES = {"hybridmem", "hybridmem.models", "hybridmem.config", "hybridmem.errors",
                "hybridmem.cli_admin",
                "hybridmem.server", "hybridmem.asgi", "hybridmem.mcp", "hybridmem.offline", "hybridmem.lexical",
                "hybridmem.graph", "hybridmem.names", "hybridmem.policy", "hybridmem.extract",
                "hybridmem.vector", "hybridmem.text"}
MAX_LINES = 600


def _imports(tree: ast.AST, module: str) -> Iterator[tuple[str, str | None]]:
    """(imported module, imported name or None) for every import in the tree."""
    package = "hybridmem" if module.startswith("hybridmem") else ""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = f"{package}.{base}".rstrip(".")
            for alias in node.names:
                yield base, alias.name


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.stem)
def test_no_module_is_over_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.name} has {lines} lines; split it along a concern"


@pytest.mark.parametrize("name", sorted(PURE))
def test_pure_modules_import_no_store(name: str) -> None:
    tree = ast.parse((PACKAGE / f"{name}.py").read_text(encoding="utf-8"))
    for module, _ in _imports(tree, f"hybridmem.{name}"):
        top, _, rest = module.partition(".")
        assert top not in THIRD_PARTY_IO, f"{name} imports {module}"
        if top == "hybridmem":
            assert rest.split(".")[0] not in STORES | {"memory", "write", "retrieval"}, (
                f"pure module {name} imports {module}"
            )


def _face_sources() -> Iterator[tuple[str, str]]:
    for name in ("cli.py", "cli_admin.py", "server.py", "mcp.py", "langgraph.py"):
        yield name, (PACKAGE / name).read_text(encoding="utf-8")
    for path in sorted((ROOT / "bench").glob("*.py")):
        yield f"bench/{path.name}", path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        yield f"notebooks/{path.name}", "\n".join(
            line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))
        )


@pytest.mark.parametrize("face,source", list(_face_sources()), ids=lambda v: str(v)[:40])
def test_faces_use_public_names_only(face: str, source: str) -> None:
    tree = ast.parse(source)
    for module, name in _imports(tree, "hybridmem.cli" if face.endswith(".py") else face):
        if module.split(".")[0] != "hybridmem":
            continue
        assert module in FACE_MODULES, f"{face} imports the internal module {module}"
        if name is not None:
            exported = importlib.import_module(module).__all__
            assert name in exported, f"{face} imports {module}.{name}, which is not public"
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
    assert not public & {"vectors", "lexical", "graph", "history_store", "weights"}
