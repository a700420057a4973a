"""The notebooks run top to bottom on a real ipykernel, offline, and show what they promise.

They are committed *with* their outputs (so the graph picture shows when browsing the repository)
and a test fails if a committed notebook lacks outputs or shows an error. After changing one,
refresh them with ``python tests/test_notebooks.py`` (offline; no ``HYBRIDMEM_*`` variable is used).

Each notebook is executed with ``nbclient`` in ``notebooks/`` (as a user opening it would). The
kernel is the ``python3`` spec written by ipykernel for *this* interpreter into a temporary
``JUPYTER_PATH``, which Jupyter searches before the user's and the system's kernel folders, so a
developer's own ``python3`` kernel can never run the tests. Notebook 03 talks to the real
OpenAI-wire test server through ``HYBRIDMEM_BASE_URL``; the others see no ``HYBRIDMEM_*`` variable
(the autouse ``_clean_env`` fixture removed them before the kernel inherits the environment).
"""

from __future__ import annotations

import json
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


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``python3`` kernelspec for this interpreter; no personal IPython or matplotlib setup."""
    kernels = tmp_path / "jupyter" / "kernels"
    kernelspec.write_kernel_spec(kernels / "python3")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # no profile startup files
    monkeypatch.delenv("MPLBACKEND", raising=False)  # the notebook picks the inline backend
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert Path(spec.argv[0]) == Path(sys.executable), spec.argv


def execute(path: Path) -> nbformat.NotebookNode:
    """Run every cell in ``notebooks/``; any cell error raises ``CellExecutionError``."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
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


def test_notebooks_exist() -> None:
    assert [p.stem for p in NOTEBOOKS][:3] == [
        "01_quickstart", "02_ecommerce_graph", "03_openai_compatible",
    ]


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
        assert any("image/png" in out.get("data", {}) for out in tagged(nb, "graph-picture").outputs)
    if path.stem == "01_quickstart":
        assert "Dell UltraSharp 4K monitor" in text_of(tagged(nb, "search"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(
    path: Path, kernel_env: None, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    server: OpenAIWireServer | None = None
    if path.stem == LIVE:
        server = request.getfixturevalue("openai_server")
        monkeypatch.setenv("HYBRIDMEM_BASE_URL", server.base_url)
        monkeypatch.setenv("HYBRIDMEM_API_KEY", "sk-test")
    nb = execute(path)
    CHECKS.get(path.stem, lambda nb, server: None)(nb, server)


def check_quickstart(nb: nbformat.NotebookNode, server: OpenAIWireServer | None) -> None:
    search = text_of(tagged(nb, "search"))
    assert "Dell UltraSharp 4K monitor" in search and "why: " in search
    context = text_of(tagged(nb, "context"))
    tokens, budget = context.split("Context(tokens=")[1].split(",")[0].split("/")
    assert 0 < int(tokens) <= int(budget) == 120
    assert text_of(tagged(nb, "forget")).endswith("0 left\n")


def check_ecommerce(nb: nbformat.NotebookNode, server: OpenAIWireServer | None) -> None:
    picture = tagged(nb, "graph-picture")
    assert any("image/png" in out.get("data", {}) for out in picture.outputs)
    products = json.loads((ROOT / "hybridmem" / "demo_data" / "products.json").read_text(encoding="utf-8"))
    names = {p["name"] for p in products}
    printed = text_of(tagged(nb, "recommend"))
    owns = printed.split("\n")[0]
    lines = printed.split("recommended:\n")[1].split("\n\nleft out:")[0].splitlines()
    recommended = [n for n in names for line in lines if line.strip().startswith(n)]
    assert recommended and len(recommended) == len(lines), printed
    assert not [n for n in recommended if n in owns], "recommended something already owned"
    assert "-complements->" in text_of(tagged(nb, "path"))


def check_live(nb: nbformat.NotebookNode, server: OpenAIWireServer | None) -> None:
    assert server is not None
    assert f"ok: {CHAT_QUESTION[:50]}" in text_of(tagged(nb, "reply"))
    chats = [
        r for r in server.requests_to("chat")
        if not r.body.get("response_format") and r.messages[-1]["content"] == CHAT_QUESTION
    ]
    assert len(chats) == 1
    system = chats[0].messages[0]["content"]
    assert "<memory>" in system and "ASUS ROG Strix G16" in system
    shown = text_of(tagged(nb, "context")).split("\n", 1)[1]  # after "86/300 tokens of context:"
    assert shown.strip() and shown.strip() in system
    assert {r.api_key for r in server.requests} == {"sk-test"}


CHECKS = {
    "01_quickstart": check_quickstart, "02_ecommerce_graph": check_ecommerce, LIVE: check_live,
}


def test_live_section_is_skipped_without_an_endpoint(kernel_env: None) -> None:
    nb = execute(NOTEBOOK_DIR / f"{LIVE}.ipynb")
    assert "HYBRIDMEM_BASE_URL is not set" in text_of(tagged(nb, "endpoint"))
    assert text_of(tagged(nb, "reply")) == ""
    providers = text_of(tagged(nb, "providers"))
    assert providers.count("SecretStr('**********')") == 3
    assert "your-" not in providers  # the placeholder keys are never shown


def save_outputs() -> None:
    """Execute every notebook offline (no HYBRIDMEM_* or OPENAI_* variable) and save it with its
    outputs; per-cell timing metadata is dropped so a re-run changes only what the cells show."""
    import os
    import tempfile

    for name in [n for n in os.environ if n.startswith(("HYBRIDMEM_", "OPENAI_"))]:
        del os.environ[name]
    with tempfile.TemporaryDirectory() as tmp:
        kernelspec.write_kernel_spec(Path(tmp) / "jupyter" / "kernels" / "python3")
        os.environ["JUPYTER_PATH"] = str(Path(tmp) / "jupyter")
        os.environ["IPYTHONDIR"] = str(Path(tmp) / "ipython")
        os.environ.pop("MPLBACKEND", None)
        for path in NOTEBOOKS:
            nb = execute(path)
            for cell in nb.cells:
                cell.metadata.pop("execution", None)
            nbformat.write(nb, path)
            print("saved", path.relative_to(ROOT))


if __name__ == "__main__":
    save_outputs()
