"""What a fresh install gets: the demo data inside the wheel, the extras, one version.

The wheel test builds a real wheel from a copy of this checkout (no network: the build runs in
this environment), installs it alone into a folder and runs its demo from ``/``, so nothing of the
checkout can stand in for what the wheel lacks."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import hybridmem

if sys.version_info >= (3, 11):
    import tomllib
else:  # the [dev] extra installs tomli on Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
DEMO_FILES = ("memories.jsonl", "demo_queries.json", "products.json")


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_demo_data_has_one_copy_inside_the_package() -> None:
    """hybridmem/demo_data/ is what the wheel ships and what every test, notebook and bench
    reads; data/ only points there, so no second copy can drift."""
    for name in DEMO_FILES:
        assert (ROOT / "hybridmem" / "demo_data" / name).is_file()
        assert not (ROOT / "data" / name).exists(), f"data/{name} duplicates hybridmem/demo_data/"


def test_extras_and_core_dependencies() -> None:
    core = _names(PYPROJECT["dependencies"])
    extras = {k: _names(v) for k, v in PYPROJECT["optional-dependencies"].items()}
    assert not core & {"fastapi", "uvicorn", "httpx", "matplotlib", "prometheus-client"}
    assert extras["server"] == {"fastapi", "uvicorn", "fastapi-offline", "prometheus-client"}
    assert extras["otel"] == {"opentelemetry-api"}
    assert extras["notebooks"] >= {"matplotlib", "ipykernel", "nbclient", "nbformat"}
    assert extras["mcp"] == {"mcp"}
    assert extras["langgraph"] == {"langgraph"}
    assert extras["all"] == (extras["server"] | extras["notebooks"] | extras["mcp"]
                             | extras["langgraph"] | extras["otel"])
    # The README's test command installs [dev] only: it must hold every extra the tests use.
    assert extras["dev"] >= extras["all"] | {"httpx", "pytest", "pytest-timeout", "hypothesis",
                                             "mypy", "mkdocs", "tomli"}


def test_one_version_source() -> None:
    assert "version" not in PYPROJECT and "version" in PYPROJECT["dynamic"]
    spots = [p for p in (ROOT / "hybridmem").glob("*.py")
             if re.search(r"^__version__ = ", p.read_text(encoding="utf-8"), flags=re.M)]
    assert [p.name for p in spots] == ["__init__.py"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", hybridmem.__version__)
    assert PYPROJECT["urls"] and PYPROJECT["classifiers"]


@pytest.mark.slow
def test_the_wheel_ships_the_demo_and_runs_it_from_any_directory(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", "tests", "bench", "notebooks"))
    dist, target = tmp_path / "dist", tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(source)], check=True, timeout=300, capture_output=True)
    (wheel,) = dist.glob("hybridmem-*.whl")
    assert f"-{hybridmem.__version__}-" in wheel.name
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(meta).decode()
    assert {f"hybridmem/demo_data/{n}" for n in DEMO_FILES} <= names
    assert "hybridmem/py.typed" in names
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "hybridmem").rglob("*.py")}
    assert len(modules) > 60 and modules <= names, sorted(modules - names)  # every wing ships
    assert "Provides-Extra: server" in metadata and "Requires-Dist: fastapi" in metadata
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, timeout=300, capture_output=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import hybridmem; print(hybridmem.__file__)"],
        capture_output=True, text=True, timeout=60, cwd="/", env=env, check=True)
    assert where.stdout.startswith(str(target))  # the installed wheel, not this checkout
    done = subprocess.run(
        [sys.executable, "-m", "hybridmem.cli", "demo", "--json", "--data-dir",
         str(tmp_path / "store")],
        capture_output=True, text=True, timeout=300, cwd="/", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    answers = json.loads(done.stdout)
    queries = json.loads((ROOT / "hybridmem" / "demo_data" / "demo_queries.json").read_text(encoding="utf-8"))
    assert [a["query"] for a in answers] == [q["query"] for q in queries]
    assert all(a["hits"] for a in answers)


#: What must never be committed: tool caches, virtual environments, benchmark output. A committed
#: ``.mypy_cache`` once made a whole submission too big to land.
NEVER_TRACKED = (".mypy_cache/", ".ruff_cache/", ".venv/", "__pycache__/", ".pytest_cache/",
                 ".hypothesis/", "bench/results/", "hm-data/")
MAX_TRACKED_BYTES = 1 << 20  # the largest file we ship, the tokenizer JSON, is 0.45 MiB


def _never_tracked(paths: list[str]) -> list[str]:
    return [p for p in paths if any(f"/{d}" in f"/{p}" for d in NEVER_TRACKED)]


def test_the_cache_check_can_fail() -> None:
    assert _never_tracked([".mypy_cache/3.11/x.json", "a/__pycache__/b.pyc", "bench/results/r.json"]) \
        == [".mypy_cache/3.11/x.json", "a/__pycache__/b.pyc", "bench/results/r.json"]
    assert _never_tracked(["bench/locomo.py", "hybridmem/cache.py", "docs/venv.md"]) == []


def test_the_repository_tracks_no_caches_and_no_large_files() -> None:
    if not (ROOT / ".git").exists():  # CI runs from a clone, so this cannot apply there
        pytest.skip("not a git checkout (an sdist or wheel)")
    if shutil.which("git") is None:
        pytest.fail("git is required to list the tracked files: install it "
                    "(Debian/Ubuntu: apt-get install git) — CI must not skip this test")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    paths = [p for p in listed.stdout.decode().split("\0") if p]
    assert paths, "git ls-files listed nothing"
    cached = _never_tracked(paths)
    assert cached == [], f"caches or outputs are tracked; git rm -r --cached them: {cached[:5]}"
    large = [p for p in paths if (ROOT / p).is_file() and (ROOT / p).stat().st_size > MAX_TRACKED_BYTES]
    assert large == [], f"files over 1 MiB are tracked (keep generated data out of git): {large}"
