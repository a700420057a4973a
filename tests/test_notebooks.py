"""The notebooks run top to bottom on a real ipykernel, offline, and show what is committed.

They are committed *with* their outputs (so the graph picture shows when browsing the repository).
Each test run executes every notebook afresh and compares what each code cell shows with the
committed outputs, after :func:`normalise` has replaced what differs between two honest runs
(temporary paths, memory ids, dates, millisecond timings, the bytes of an image): a committed
output that differs from what the code shows fails the test. After changing a notebook or
anything it shows, refresh them all with ``python tests/test_notebooks.py`` (offline; no
``HYBRIDMEM_*`` or ``OPENAI_*`` variable is used).

Each notebook runs with ``nbclient`` in an empty temporary working directory (a notebook must not
depend on where it is opened) and with ``TMPDIR`` pointing into the test's own folder, where the
notebooks keep their stores. The kernel is the ``python3`` spec written by ipykernel for *this*
interpreter into a temporary ``JUPYTER_PATH``, which Jupyter searches before the user's and the
system's kernel folders, so a developer's own ``python3`` kernel can never run the tests. Pictures
use matplotlib's inline backend, which renders with Agg (no display needed). Notebook 03 talks to
the real OpenAI-wire test server through ``HYBRIDMEM_BASE_URL`` in :func:`test_live_call`; every
other run sees no ``HYBRIDMEM_*`` variable (the autouse ``_clean_env`` fixture removed them before
the kernel inherits the environment).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import nbclient
import nbformat
import pytest
from ipykernel import kernelspec
from jupyter_client.kernelspec import KernelSpecManager

from openai_wire import OpenAIWireServer

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
LIVE = "03_openai_compatible"
CHAT_QUESTION = "Which monitor would you recommend for my laptop?"

#: What differs between two honest runs of a notebook, and what it is replaced with before the
#: fresh outputs are compared with the committed ones. Everything else must match exactly.
VOLATILE: list[tuple[re.Pattern[str], str]] = [
    # a tempfile.TemporaryDirectory(prefix="hybridmem-<name>-"), wherever TMPDIR pointed
    (re.compile(r"[^\s'\"]*/hybridmem-([a-z]+)-[a-z0-9_]{8}\b"), r"<tmp>/hybridmem-\1-*"),
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<id>"),  # a memory id
    (re.compile(r"\bid=[0-9a-f]{8}\b"), "id=<id>"),  # a memory id as MemoryItem's repr shortens it
    (re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
                r"(?:Z|[+-]\d{2}:?\d{2})?)?\b"), "<date>"),
    (re.compile(r"\b\d+(?:\.\d+)? ?ms\b"), "<ms>"),
]


def normalise(text: str) -> str:
    """``text`` with every :data:`VOLATILE` part replaced by its placeholder."""
    for pattern, placeholder in VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


def kernel_environ(tmp: Path) -> dict[str, str]:
    """The environment a notebook kernel runs in: a ``python3`` kernelspec for this interpreter
    under ``tmp`` and no personal IPython profile."""
    kernelspec.write_kernel_spec(tmp / "jupyter" / "kernels" / "python3")
    return {
        "JUPYTER_PATH": str(tmp / "jupyter"),
        "IPYTHONDIR": str(tmp / "ipython"),  # no profile startup files
    }


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The kernel environment (see :func:`kernel_environ`) with ``TMPDIR`` in ``tmp_path``;
    returns an empty working directory."""
    for name, value in kernel_environ(tmp_path).items():
        monkeypatch.setenv(name, value)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the notebook picks the inline backend
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert Path(spec.argv[0]) == Path(sys.executable), spec.argv
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return cwd


def execute(path: Path, cwd: Path) -> nbformat.NotebookNode:
    """Run every cell with ``cwd`` as the working directory; a cell error raises
    ``CellExecutionError``. Streams are coalesced and no timing is recorded, so a saved notebook
    changes only where what the cells show changes."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}},
        coalesce_streams=True, record_timing=False,
    )
    client.execute()
    return nb


def tagged(nb: nbformat.NotebookNode, tag: str) -> nbformat.NotebookNode:
    cells = [c for c in nb.cells if tag in c.get("metadata", {}).get("tags", [])]
    assert len(cells) == 1, f"expected one cell tagged {tag!r}, found {len(cells)}"
    return cells[0]


def text_of(cell: nbformat.NotebookNode) -> str:
    """Everything a cell printed or displayed as text."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def shown(nb: nbformat.NotebookNode) -> str:
    """What every code cell shows, normalised: streams by name (consecutive chunks joined), each
    displayed value as its text plus a ``<image/png>`` marker per picture (the bytes of a picture
    differ with the fonts and the matplotlib version, so only its presence is compared)."""
    blocks = []
    code = [c for c in nb.cells if c.cell_type == "code"]
    for number, cell in enumerate(code, 1):
        parts: list[list[str]] = []
        for out in cell.outputs:
            if out.output_type == "stream":
                if parts and parts[-1][0] == out.name:
                    parts[-1][1] += out.text
                else:
                    parts.append([out.name, out.text])
            elif out.output_type == "error":
                parts.append(["error", f"{out.ename}: {out.evalue}"])
            else:
                data = out.get("data", {})
                images = [f"<{mime}>" for mime in sorted(data) if mime.startswith("image/")]
                parts.append([out.output_type, "\n".join([data.get("text/plain", ""), *images])])
        first_line = cell.source.splitlines()[0] if cell.source else ""
        blocks.append(f"--- cell {number}: {first_line}\n"
                      + "".join(f"[{kind}]\n{text.rstrip()}\n" for kind, text in parts))
    return normalise("".join(blocks))


def test_notebooks_exist() -> None:
    assert [p.stem for p in NOTEBOOKS][:3] == [
        "01_quickstart", "02_ecommerce_graph", "03_openai_compatible",
    ]


def test_normalise_replaces_only_what_differs_between_runs() -> None:
    fresh = normalise(
        "Memory(store='/tmp/pytest-of-ci/pytest-3/t0/tmp/hybridmem-shop-k2_9xq0a') "
        "MemoryItem(id=829ee377, ...) 9f0c2d4e8b7a41c6a5d3e2f1b0c9d8e7 "
        "- [2026-11-30] at 2026-12-04T12:48:17.185590+00:00 took 412 ms; score 1.5678 on 3 hops"
    )
    assert fresh == (
        "Memory(store='<tmp>/hybridmem-shop-*') MemoryItem(id=<id>, ...) <id> "
        "- [<date>] at <date> took <ms>; score 1.5678 on 3 hops"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_with_outputs_and_no_error(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), (
        "run top to bottom and saved: python tests/test_notebooks.py")
    assert any(c.outputs for c in code)
    for cell in code:
        for out in cell.outputs:
            assert out.output_type != "error", (cell.source[:60], out.get("ename"))
            assert not (out.output_type == "stream" and out.name == "stderr"), (
                cell.source[:60], out.text[:200])
    if path.stem == "02_ecommerce_graph":  # the picture is what a browser of the repo comes for
        picture = tagged(nb, "graph-picture")
        assert any("image/png" in out.get("data", {}) for out in picture.outputs)
    if path.stem == "01_quickstart":
        assert "Dell UltraSharp 4K monitor" in text_of(tagged(nb, "search"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_fresh_run_matches_committed(path: Path, kernel_env: Path) -> None:
    nb = execute(path, kernel_env)
    CHECKS.get(path.stem, lambda nb: None)(nb)
    committed = nbformat.read(path, as_version=4)
    assert shown(nb) == shown(committed), (
        f"{path.name}: committed outputs are stale; refresh them: python tests/test_notebooks.py")
    assert not any(kernel_env.iterdir()), "the notebook wrote into its working directory"
    assert not list((kernel_env.parent / "tmp").glob("hybridmem-*")), "a store was left behind"


def check_quickstart(nb: nbformat.NotebookNode) -> None:
    search = text_of(tagged(nb, "search"))
    assert "Dell UltraSharp 4K monitor" in search and "why: " in search
    context = text_of(tagged(nb, "context"))
    tokens, budget = context.split("Context(tokens=")[1].split(",")[0].split("/")
    assert 0 < int(tokens) <= int(budget) == 120
    assert text_of(tagged(nb, "forget")).endswith("0 left\n")


def check_ecommerce(nb: nbformat.NotebookNode) -> None:
    picture = tagged(nb, "graph-picture")
    assert any("image/png" in out.get("data", {}) for out in picture.outputs)
    graph = text_of(tagged(nb, "graph")).splitlines()
    assert len(graph) - 1 == int(graph[0].split(", ")[1].split()[0])  # one line per relation
    catalogue = ROOT / "hybridmem" / "demo_data" / "products.json"
    products = json.loads(catalogue.read_text(encoding="utf-8"))
    names = {p["name"] for p in products}
    printed = text_of(tagged(nb, "recommend"))
    owns = printed.split("\n")[0]
    lines = printed.split("recommended:\n")[1].split("\n\nleft out:")[0].splitlines()
    recommended = [n for n in names for line in lines if line.strip().startswith(n)]
    assert recommended and len(recommended) == len(lines), printed
    assert not [n for n in recommended if n in owns], "recommended something already owned"
    walks = text_of(tagged(nb, "path"))
    assert [int(n) > 0 for n in re.findall(r": (\d+) hops\n", walks)] == [True, True], walks
    assert "-complements->" in walks


def check_live_skipped(nb: nbformat.NotebookNode) -> None:
    assert "HYBRIDMEM_BASE_URL is not set" in text_of(tagged(nb, "endpoint"))
    assert text_of(tagged(nb, "reply")) == ""
    providers = text_of(tagged(nb, "providers"))
    assert providers.count("SecretStr('**********')") == 3
    assert "your-" not in providers  # the placeholder keys are never shown


CHECKS = {
    "01_quickstart": check_quickstart, "02_ecommerce_graph": check_ecommerce,
    LIVE: check_live_skipped,
}


def test_live_call(
    kernel_env: Path, openai_server: OpenAIWireServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYBRIDMEM_BASE_URL", openai_server.base_url)
    monkeypatch.setenv("HYBRIDMEM_API_KEY", "sk-test")
    nb = execute(NOTEBOOK_DIR / f"{LIVE}.ipynb", kernel_env)
    assert f"ok: {CHAT_QUESTION[:50]}" in text_of(tagged(nb, "reply"))
    chats = [
        r for r in openai_server.requests_to("chat")
        if not r.body.get("response_format") and r.messages[-1]["content"] == CHAT_QUESTION
    ]
    assert len(chats) == 1
    system = chats[0].messages[0]["content"]
    assert "<memory>" in system and "ASUS ROG Strix G16" in system
    shown_context = text_of(tagged(nb, "context")).split("\n", 1)[1]  # after "86/300 tokens ..."
    assert shown_context.strip() and shown_context.strip() in system
    assert {r.api_key for r in openai_server.requests} == {"sk-test"}


def save_outputs() -> None:
    """Execute every notebook offline (no HYBRIDMEM_* or OPENAI_* variable), as the tests do, and
    save it with its outputs."""
    import os
    import tempfile

    for name in [n for n in os.environ if n.startswith(("HYBRIDMEM_", "OPENAI_"))]:
        del os.environ[name]
    os.environ.pop("MPLBACKEND", None)
    for path in NOTEBOOKS:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ.update(kernel_environ(Path(tmp)))
            (Path(tmp) / "cwd").mkdir()
            nb = execute(path, Path(tmp) / "cwd")
        nbformat.write(nb, path)
        print("saved", path.relative_to(ROOT))


if __name__ == "__main__":
    save_outputs()
