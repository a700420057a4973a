"""The documentation site builds with ``mkdocs build --strict`` (so every page, link, anchor and
API object resolves), its API reference covers every public name, and no page narrates how the
software was made (that is the changelog's job)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hybridmem

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference.md"
#: Public objects outside ``hybridmem.__all__`` that the reference documents, by public path.
EXTRA_PUBLIC = ("hybridmem.offline.LocalEmbedder", "hybridmem.offline.HashEmbedder",
                "hybridmem.offline.TiktokenCounter", "hybridmem.server.create_app",
                "hybridmem.server.Metrics", "hybridmem.observe.Observer",
                "hybridmem.observe.NullObserver", "hybridmem.observe.OTelObserver",
                "hybridmem.observe.Observers",
                "hybridmem.graph.NetworkXGraphStore", "hybridmem.extract.RuleExtractor")
#: What documentation must not say: development stages and tracker numbers.
NARRATION = re.compile(r"session [0-9]|issue [0-9]+|#[0-9]{1,3}\b", re.I)
#: ... and, outside the changelog, how things were before.
HISTORY = re.compile(r"\b(used to|no longer|as before)\b", re.I)


def _public_paths() -> list[str]:
    return [f"hybridmem.{name}" for name in hybridmem.__all__] + list(EXTRA_PUBLIC)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
         str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_the_site_builds_strictly_and_documents_every_public_name(site: Path) -> None:
    html = (site / "reference" / "index.html").read_text(encoding="utf-8")
    missing = [path for path in _public_paths() if f'id="{path}"' not in html]
    assert missing == [], f"the built API reference has no entry for {missing}"
    for page in sorted((ROOT / "docs").glob("*.md")):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.exists(), f"{page.name} is not in the built site (add it to mkdocs.yml's nav)"


def test_the_reference_names_every_public_object_by_its_public_path() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    directives = re.findall(r"^::: (\S+)", text, flags=re.M)
    missing = [path for path in _public_paths() if path not in directives]
    assert missing == [], f"docs/reference.md has no '::: {missing[0] if missing else ''}'"
    # internal modules move; only the package and the public modules above are referenced
    public_modules = {"hybridmem"} | {p.rsplit(".", 1)[0] for p in EXTRA_PUBLIC}
    internal = [d for d in directives if d.rsplit(".", 1)[0] not in public_modules]
    assert internal == [], f"docs/reference.md refers to internal paths: {internal}"


def test_no_page_narrates_development() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", ROOT / "bench" / "README.md",
             ROOT / "data" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        hits = NARRATION.findall(text)
        if page.name != "CHANGELOG.md":
            hits += HISTORY.findall(text)
        found += [f"{page.relative_to(ROOT)}: {hit!r}" for hit in hits]
    assert found == [], "history belongs in CHANGELOG.md (dates, no tracker numbers):\n" + \
        "\n".join(found)


def test_the_narration_check_can_fail() -> None:
    # the samples are assembled, so a grep of the project for narration does not find them here
    session, issue = "Session", "issue"
    assert NARRATION.search(f"measured in {session} 9") and NARRATION.search("see #" + "12")
    assert NARRATION.search(f"fixes {issue} 26") and not NARRATION.search("rank 1 of 2")
    assert HISTORY.search("it used to merge") and not HISTORY.search("the encoding that counts")
