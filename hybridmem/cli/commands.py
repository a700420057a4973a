"""The ``hybridmem`` command: a thin layer over the Memory class.

Errors print one clear line on stderr and exit non-zero (1: the operation failed, 2: bad usage or
a bad setting); ``--json`` prints machine-readable output. Every command but ``demo`` opens its
Memory the same way (:func:`_memory`: settings from the environment, ``--data-dir`` over them).

- the everyday verbs: demo, add, remember, import, list, facts, search, context, chat, forget,
  prune, export, stats, serve, reextract, mcp;
- ``graph export``: a user's entity graph as node-link JSON, GraphML or GEXF; ``graph path``: the
  k shortest paths between two entities;
- the operator's commands, over every user of a data dir (or one): backup, restore, reembed, purge.

Reading an import file is :mod:`hybridmem.cli.importfile`'s.
"""

from __future__ import annotations

import gc
import json
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from importlib import resources
from pathlib import Path
from enum import Enum
from typing import TYPE_CHECKING, Any, Optional

import typer
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource
from rich.console import Console
from rich.table import Table

from hybridmem import HybridMemError, Hit, MemoryItem, Settings, __version__
from hybridmem.models import MAX_PATHS
from hybridmem.cli.importfile import ImportFileError, batches, read_bundle, read_rows

if TYPE_CHECKING:  # imported when a command runs, so --help never loads the stores' modules
    from hybridmem import Memory
    from hybridmem.observe import Observer

HELP = """Long-term memory for LLM apps, from the command line.

Every command but demo reads HYBRIDMEM_* settings from the environment (see
docs/configuration.md); --data-dir overrides HYBRIDMEM_DATA_DIR. Exit codes: 0 done, 1 the
operation failed, 2 bad usage or a bad setting."""

app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP, rich_markup_mode=None)
graph_app = typer.Typer(no_args_is_help=True, help="A user's entity graph.", rich_markup_mode=None)
app.add_typer(graph_app, name="graph")
out = Console()
err = Console(stderr=True)

DataDirOpt = typer.Option(None, "--data-dir", help="Where memories live (HYBRIDMEM_DATA_DIR).")
JsonOpt = typer.Option(False, "--json", help="Print JSON.")
MinScoreOpt = typer.Option(
    None, min=0.0, help="Leave out hits scoring below this (default: HYBRIDMEM_MIN_SCORE)."
)
AsOfOpt = typer.Option(
    None,
    formats=["%Y-%m-%d", "%Y-%m-%dT%H:%M:%S"],
    help="The memory as it stood at this time (UTC).",
)
UserOpt = typer.Option(None, "--user", help="Only this user (default: every user).")
CategoryOpt = typer.Option(None, "--category", help="Only memories of this category.")

#: Bounded commands run without the cyclic GC (:func:`main`): all they build lives until exit, and
#: collections walking chromadb's import and the graph cost 0.3-0.6 s of a 2.2-2.7 s cold search.
ONE_SHOT = frozenset({"search", "context", "add", "remember", "list", "facts", "forget", "prune",
                      "stats", "export"})

SERVER_EXTRA = "pip install 'hybridmem[server]'"
MCP_EXTRA = "pip install 'hybridmem[mcp]'"


# -- how every command opens a Memory and fails ----------------------------------------------------
def _fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``error: message`` on stderr (no markup, no wrapping) and return the exit to raise."""
    err.print(f"error: {message}", highlight=False, markup=False, soft_wrap=True)
    return typer.Exit(code=code)


def _env_name(field: str) -> str:
    """The environment variable that sets ``field`` (``openai_api_key``: OPENAI_API_KEY)."""
    return "OPENAI_API_KEY" if field == "openai_api_key" else f"HYBRIDMEM_{field.upper()}"


def _settings(**fields: Any) -> Settings:
    """Settings from the environment and ``fields``; a bad value exits 2 naming the variable and
    the problem (never its value: it may be a key)."""
    try:
        return Settings(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        problems = []
        for e in exc.errors():
            field = str(e["loc"][0]) if e.get("loc") else ""
            name = f"{_env_name(field)} ({field})" if field else "settings"
            problems.append(f"{name}: {e.get('msg', 'invalid')}")
        raise _fail("invalid setting " + "; ".join(problems), code=2) from None


@contextmanager
def _memory(
    data_dir: Optional[Path] = None, *, settings: Settings | None = None,
    observer: Observer | None = None,
) -> Iterator[Memory]:
    """Open a Memory (environment settings, ``--data-dir`` over them); our errors in one line."""
    settings = settings if settings is not None else _settings(data_dir=data_dir)
    try:
        from hybridmem import Memory

        with Memory(settings, observer=observer) as mem:
            yield mem
    except HybridMemError as exc:
        raise _fail(str(exc)) from None


def _version(value: bool) -> None:
    """``--version``: print the version and stop before any command runs."""
    if value:
        print(f"hybridmem {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    # The garbage collector comes back on for every command but a ONE_SHOT one (main() disabled it).
    if ctx.invoked_subcommand not in ONE_SHOT:
        gc.enable()


def _items_table(title: str, items: list[MemoryItem]) -> Table:
    """Memories as a table: id, kind, category, when written, text."""
    table = Table(title=title, title_justify="left", show_lines=False, expand=True)
    table.add_column("id", no_wrap=True, style="dim")
    table.add_column("kind")
    table.add_column("category")
    table.add_column("created", no_wrap=True)
    table.add_column("memory", ratio=3)
    for item in items:
        table.add_row(item.id, item.kind, item.category, f"{item.created_at:%Y-%m-%d}",
                      item.text)
    return table


def _items_json(items: list[MemoryItem]) -> str:
    return json.dumps([i.model_dump(mode="json") for i in items], indent=2, ensure_ascii=False)


def _hits_table(title: str, hits: list[Hit]) -> Table:
    """Search hits as a table: score, memory text and why it was found."""
    table = Table(title=title, title_justify="left", show_lines=False, expand=True)
    table.add_column("score", justify="right", width=7)
    table.add_column("memory", ratio=3)
    table.add_column("why", ratio=2, style="dim")
    for hit in hits:
        table.add_row(f"{hit.score:.4f}", hit.item.text, hit.why)
    return table


# -- the demo's data and settings ------------------------------------------------------------------
def _demo_files(data: Optional[Path]) -> tuple[str, str]:
    """The demo's memories.jsonl and demo_queries.json: from ``--data`` or the installed package."""
    if data is not None:
        memories, queries = data / "memories.jsonl", data / "demo_queries.json"
        if not memories.is_file() or not queries.is_file():
            raise _fail(f"{data} has no memories.jsonl and demo_queries.json")
        return memories.read_text(encoding="utf-8"), queries.read_text(encoding="utf-8")

    shipped = resources.files("hybridmem") / "demo_data"
    memories_text = (shipped / "memories.jsonl").read_text(encoding="utf-8")
    queries_text = (shipped / "demo_queries.json").read_text(encoding="utf-8")
    return memories_text, queries_text


class _OfflineSettings(Settings):
    """The demo's settings: keyword arguments only. No ``HYBRIDMEM_*`` variable nor
    ``OPENAI_API_KEY`` is read, so the demo is offline and the same on every machine."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


OFFLINE = (
    "offline: local embedder, rule extractor, no endpoint; the demo reads no HYBRIDMEM_* "
    "variable nor OPENAI_API_KEY"
)


# -- the everyday verbs ----------------------------------------------------------------------------
@app.command()
def demo(
    data: Optional[Path] = typer.Option(
        None, "--data", help="A folder with memories.jsonl and demo_queries.json "
        "(default: the sample shipped inside the package)."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Keep the demo store here (default: a temporary folder)."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Load the shipped e-commerce sample and run its demo queries. Always offline: the local
    embedder and the rule extractor, whatever the environment says."""
    memories, queries = _demo_files(data)
    rows = [json.loads(line) for line in memories.splitlines() if line.strip()]
    with tempfile.TemporaryDirectory(prefix="hybridmem-demo-") as tmp:
        settings = _OfflineSettings(
            data_dir=data_dir or Path(tmp), embedder="local", extractor="rules", chroma_url=None,
            base_url=None, api_key=None, openai_api_key=None, embedding_base_url=None,
        )
        with _memory(settings=settings) as mem:
            started = time.perf_counter()
            by_user: dict[str, list[dict[str, Any]]] = {}
            for row in rows:
                by_user.setdefault(row.pop("user_id"), []).append(row)
            for user_id, items in by_user.items():
                mem.add_many(user_id, items)
            took = time.perf_counter() - started

            results = [
                (q, mem.search(q["user_id"], q["query"], limit=3)) for q in json.loads(queries)
            ]
            if as_json:
                print(json.dumps([
                    {"user_id": q["user_id"], "query": q["query"],
                     "hits": [h.model_dump(mode="json") for h in hits]}
                    for q, hits in results
                ], indent=2))
                return

            extractor = mem.extractor.name if mem.extractor else "none"
            out.print(
                f"Loaded {len(rows)} memories of {len(by_user)} customers in {took:.1f}s "
                f"(embedder {mem.embedder.name}, extractor {extractor})",
                highlight=False,
            )
            out.print(OFFLINE + "\n", highlight=False, markup=False)
            for q, hits in results:
                out.print(_hits_table(f"{q['user_id']}: {q['query']}", hits))

            first = results[0][0]
            ctx = mem.context(first["user_id"], first["query"], max_tokens=200)
            out.print(
                f"\n[bold]context for {first['user_id']!r}[/bold] "
                f"({ctx.tokens}/{ctx.max_tokens} tokens, {ctx.encoding}):"
            )
            out.print(ctx.text, highlight=False, markup=False)


#: ``--relation "SUBJECT -PREDICATE-> OBJECT"``: the way relations are printed.
_RELATION = re.compile(r"^\s*(.+?)\s+-(\S+)->\s+(.+?)\s*$")


def _relation(spec: str) -> tuple[str, str, str]:
    found = _RELATION.match(spec)
    if found is None:
        raise _fail(f"--relation {spec!r}: write it as 'SUBJECT -PREDICATE-> OBJECT'", code=2)
    return found.group(1), found.group(2), found.group(3)


@app.command()
def add(
    user_id: str,
    text: str,
    category: str = typer.Option("general", help="Category of the memory."),
    importance: float = typer.Option(0.5, min=0.0, max=1.0),
    kind: str = typer.Option("fact", help="fact, turn, summary or procedure (how-to steps)."),
    entity: list[str] = typer.Option([], "--entity", help="An entity the text is about "
                                     "(repeat it for more); joins the graph."),
    relation: list[str] = typer.Option([], "--relation", help="A known relation, "
                                       "'SUBJECT -PREDICATE-> OBJECT' (repeat it for more)."),
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Store one memory; prints its id."""
    relations = [_relation(r) for r in relation]
    with _memory(data_dir) as mem:
        item = mem.add(user_id, text, category=category, importance=importance, kind=kind,
                       entities=entity or None, relations=relations or None)
        print(item.model_dump_json() if as_json else item.id)


@app.command()
def remember(
    user_id: str,
    key: str,
    value: str,
    category: str = typer.Option("general", help="Category of the fact."),
    confidence: float = typer.Option(1.0, min=0.0, max=1.0),
    importance: float = typer.Option(0.8, min=0.0, max=1.0),
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Set a key fact (city, diet, plan ...): one current value per KEY, the older value kept
    as superseded history; prints its id."""
    with _memory(data_dir) as mem:
        item = mem.remember(user_id, key, value, category=category, confidence=confidence,
                            importance=importance)
        print(item.model_dump_json() if as_json else item.id)


@app.command(name="import")
def import_cmd(
    args: list[str] = typer.Argument(
        ..., metavar="[USER] PATH", show_default=False,
        help="The default user (optional), then the file."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="An export JSON may replace memories whose ids exist."),
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Import memories from JSONL, CSV or an export JSON.

    JSONL: one object per line, with the fields of a memory (text, category, importance,
    metadata, ...) or a conversation turn (role, content). CSV: a header naming the same fields;
    any other column is kept as a metadata key. Each row is stored under its own user_id; USER is
    the default for rows without one (and the target of an export JSON). Every row is checked
    before anything is stored: a bad row stops the import with its line number."""
    if len(args) > 2:
        raise _fail("give at most USER and PATH", code=2)
    if len(args) == 1:
        default_user, path = None, Path(args[0])
    else:
        default_user, path = args[0], Path(args[1])
    if not path.is_file():
        raise _fail(f"{path} is not a file", code=2)

    if path.suffix.lower() == ".json":
        try:
            user, bundle = read_bundle(path, default_user)
        except ImportFileError as exc:
            raise _fail(str(exc), code=2) from None
        with _memory(data_dir) as mem:
            count = mem.import_(user, bundle, overwrite=overwrite)
        out.print(f"imported {count} memories into {user}", highlight=False, markup=False)
        return

    try:
        rows = read_rows(path, default_user)
    except ImportFileError as exc:
        raise _fail(str(exc), code=2) from None
    from rich.progress import track

    count = 0
    users: list[str] = []
    with _memory(data_dir) as mem:
        for user_id, batch in track(list(batches(rows)), description="importing", console=err):
            if batch[0].message is not None:
                count += len(mem.add_messages(user_id, [r.message for r in batch if r.message]))
            else:
                count += len(mem.add_many(user_id, [r.memory for r in batch if r.memory]))
            if user_id not in users:
                users.append(user_id)

    if len(users) == 1:
        where = users[0]
    else:
        more = ", ..." if len(users) > 5 else ""
        where = f"{len(users)} users ({', '.join(users[:5])}{more})"
    out.print(f"imported {count} memories into {where}", highlight=False, markup=False)


@app.command(name="list")
def list_cmd(
    user_id: str,
    limit: int = typer.Option(100, min=1, max=1000, help="At most this many memories."),
    category: Optional[str] = CategoryOpt,
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """A user's current memories, oldest first."""
    with _memory(data_dir) as mem:
        items = mem.list(user_id, limit=limit, category=category)
        if as_json:
            print(_items_json(items))
        else:
            out.print(_items_table(f"{user_id}: {len(items)} memories", items))


@app.command()
def facts(
    user_id: str,
    category: Optional[str] = CategoryOpt,
    as_of: Optional[datetime] = AsOfOpt,
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """A user's current key facts (see remember), one "key: value" a line, by key."""
    with _memory(data_dir) as mem:
        items = mem.facts(user_id, category=category, as_of=as_of)
        if as_json:
            print(_items_json(items))
        else:
            for item in items:
                out.print(item.text, highlight=False, markup=False, soft_wrap=True)


@app.command()
def search(
    user_id: str,
    query: str,
    limit: int = typer.Option(5, min=1, max=1000),
    category: Optional[str] = CategoryOpt,
    min_score: Optional[float] = MinScoreOpt,
    as_of: Optional[datetime] = AsOfOpt,
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Hybrid search of a user's memories, with the reason for each hit."""
    with _memory(data_dir) as mem:
        hits = mem.search(user_id, query, limit=limit, category=category, min_score=min_score,
                          as_of=as_of)
        if as_json:
            print(json.dumps([h.model_dump(mode="json") for h in hits], indent=2))
        else:
            out.print(_hits_table(query, hits))


@app.command()
def context(
    user_id: str,
    query: str,
    max_tokens: int = typer.Option(600, min=1),
    min_score: Optional[float] = MinScoreOpt,
    as_of: Optional[datetime] = AsOfOpt,
    budget: list[str] = typer.Option(
        [], help="SECTION=TOKENS, a section's share (facts, relations, procedures, episodes, "
        "memories); repeatable."),
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """The token-bounded context that would be sent to the model."""
    shares = dict(b.partition("=")[::2] for b in budget)
    if not all(v.strip().isdigit() for v in shares.values()):
        raise _fail("--budget takes SECTION=TOKENS, e.g. --budget facts=150", code=2)

    with _memory(data_dir) as mem:
        budgets = {k.strip(): int(v) for k, v in shares.items()}
        ctx = mem.context(
            user_id, query, max_tokens=max_tokens, min_score=min_score, as_of=as_of,
            budgets=budgets,
        )
        if as_json:
            print(ctx.model_dump_json(indent=2))
        else:
            out.print(ctx.text, highlight=False, markup=False)
            err.print(f"{ctx.tokens}/{ctx.max_tokens} tokens ({ctx.encoding})")


@app.command()
def chat(
    user_id: str,
    message: str,
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Answer a message with memory, through the configured endpoint (HYBRIDMEM_BASE_URL)."""
    with _memory(data_dir) as mem:
        if not mem.settings.llm_configured:
            raise _fail("no chat endpoint is configured: set HYBRIDMEM_BASE_URL (with "
                        "HYBRIDMEM_API_KEY and HYBRIDMEM_CHAT_MODEL as needed), or "
                        "OPENAI_API_KEY for OpenAI")
        reply = mem.chat(user_id, message)
        print(reply.model_dump_json(indent=2) if as_json else reply.text)


@app.command()
def forget(
    user_id: str,
    memory_id: Optional[str] = typer.Argument(None, help="One memory; without it, the whole user."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Erase a whole user without asking."),
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Delete one memory, or everything of a user (asks first; --yes to skip)."""
    with _memory(data_dir) as mem:
        if memory_id is None and not yes:
            count = mem.count(user_id)
            if not sys.stdin.isatty():
                raise _fail(f"refusing to erase all {count} memories of {user_id!r} without "
                            "confirmation: pass --yes", code=2)
            if not typer.confirm(f"Erase all {count} memories of {user_id!r}?", default=False,
                                 err=True):
                err.print("nothing erased", highlight=False)
                raise typer.Exit(code=1)

        removed = mem.forget(user_id, memory_id)
        out.print(f"removed {removed} memor{'y' if removed == 1 else 'ies'}")


@app.command()
def prune(
    user_id: str,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Only list what would be removed; remove nothing."),
    min_importance: float = typer.Option(
        0.1, min=0.0, max=1.0, help="Idle memories below this importance go."),
    idle_days: float = typer.Option(
        120.0, min=0.0, help="Days without an access (or since creation) that make a memory idle."),
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Apply the retention policy: remove expired memories, and memories below
    --min-importance idle for --idle-days; --dry-run lists them and removes nothing."""
    with _memory(data_dir) as mem:
        items = mem.prune(user_id, dry_run=dry_run, min_importance=min_importance,
                          idle_days=idle_days)
    if as_json:
        print(json.dumps({"dry_run": dry_run, "memories": [
            i.model_dump(mode="json") for i in items]}, indent=2, ensure_ascii=False))
        return
    for item in items:
        out.print(f"{item.id}  {item.text}", highlight=False, markup=False, soft_wrap=True)
    noun = f"memor{'y' if len(items) == 1 else 'ies'}"
    out.print(f"would remove {len(items)} {noun} (dry run)" if dry_run
              else f"removed {len(items)} {noun}", highlight=False, markup=False)


@app.command()
def export(
    user_id: str,
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="File (default: stdout)."),
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Export everything of a user as JSON."""
    with _memory(data_dir) as mem:
        text = json.dumps(mem.export(user_id), indent=2, ensure_ascii=False)
        if output is None:
            print(text)
        else:  # a temporary file beside it, then a rename: never a half-written export
            tmp = output.with_name(f".{output.name}.tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(output)


@app.command()
def stats(user_id: str, data_dir: Optional[Path] = DataDirOpt, as_json: bool = JsonOpt) -> None:
    """Counts for one user."""
    with _memory(data_dir) as mem:
        data = mem.stats(user_id)
        if as_json:
            print(data.model_dump_json())
        else:
            for key, value in data.model_dump().items():
                out.print(f"{key}: {value}")


class GraphFormatOpt(str, Enum):
    """The file formats of ``graph export`` (see :data:`hybridmem.models.GRAPH_FORMATS`)."""

    node_link = "node-link"
    graphml = "graphml"
    gexf = "gexf"


@graph_app.command(name="export")
def graph_export(
    user_id: str,
    fmt: GraphFormatOpt = typer.Option(GraphFormatOpt.node_link, "--format", "-f",
                                       help="node-link (JSON), graphml or gexf."),
    output: Optional[Path] = typer.Option(None, "-o", "--out", help="File (default: stdout)."),
    as_of: Optional[datetime] = AsOfOpt,
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Export a user's entity graph: node-link JSON (nx.node_link_graph reads it back),
    GraphML or GEXF. In GraphML and GEXF, sets and the evidence are JSON text and times ISO
    8601 (those formats hold scalars only)."""
    with _memory(data_dir) as mem:
        raw = mem.export_graph(user_id, format=fmt.value, as_of=as_of)
    if output is None:
        print(raw.decode("utf-8"), end="")
    else:  # a temporary file beside it, then a rename: never a half-written export
        tmp = output.with_name(f".{output.name}.tmp")
        tmp.write_bytes(raw)
        tmp.replace(output)


@graph_app.command(name="path")
def graph_path(
    user_id: str,
    a: str,
    b: str,
    k: int = typer.Option(1, "-k", min=1, max=MAX_PATHS, help="How many paths at most."),
    max_depth: int = typer.Option(3, "--max-depth", min=1, help="Longest path, in hops."),
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """The k shortest paths between two entities, shortest first, one per line (ignoring the
    edges' direction, which each edge shows); nothing when there is none."""
    with _memory(data_dir) as mem:
        try:
            paths = mem.query_path(user_id, a, b, k=k, max_depth=max_depth)
        except HybridMemError as exc:
            raise _fail(str(exc), code=2) from None
    if as_json:
        print(json.dumps([p.model_dump(mode="json") for p in paths], indent=2))
        return
    for path in paths:
        print(" | ".join(path.edges))


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is "localhost" or a loopback address (another name may resolve anywhere)."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name other than localhost: it may resolve to anything
        return False


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind; off loopback a key is needed."),
    port: int = typer.Option(8080, min=1, max=65535),
    data_dir: Optional[Path] = DataDirOpt,
    log_level: str = typer.Option("info", help="debug, info, warning or error."),
) -> None:
    """Run the REST service (needs the server extra); prints the base URL to give OpenAI clients.

    Bearer keys: HYBRIDMEM_SERVER_API_KEY, comma-separated. Accepted Host headers:
    HYBRIDMEM_SERVER_ALLOWED_HOSTS; by default the loopback names on loopback, any host elsewhere
    (where a key is required)."""
    import logging

    if log_level.lower() not in {"debug", "info", "warning", "error"}:
        raise _fail("--log-level: use debug, info, warning or error", code=2)
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        raise _fail(f"hybridmem serve needs the server extra: {SERVER_EXTRA}") from None

    settings = _settings(data_dir=data_dir)
    loopback = _is_loopback(host)
    if not settings.server_keys() and not loopback:
        raise _fail(f"refusing to serve on {host} without an API key; set "
                    "HYBRIDMEM_SERVER_API_KEY (comma-separated for several) or use --host "
                    "127.0.0.1", code=2)
    from hybridmem.server import Metrics, create_app

    level = getattr(logging, log_level.upper(), logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("hybridmem").addHandler(handler)
    logging.getLogger("hybridmem").setLevel(level)

    hosts = None if settings.server_allowed_hosts or loopback else ["*"]
    shown = f"[{host}]" if ":" in host else host
    out.print(f"OpenAI-compatible base URL: http://{shown}:{port}/v1 (name the user with the "
              "'user' field or the X-HybridMem-User header)", highlight=False, markup=False,
              soft_wrap=True)
    metrics = Metrics()  # its observer times the Memory's stages for /metrics
    with _memory(settings=settings, observer=metrics.observer) as mem:
        # One worker: the embedded store belongs to this process; requests run in its threadpool.
        # uvicorn's access log is off: hybridmem.server logs route templates, not user ids.
        uvicorn.run(create_app(mem, allowed_hosts=hosts, metrics=metrics), host=host, port=port,
                    log_level=log_level.lower(), access_log=False)


@app.command()
def reextract(user_id: str, data_dir: Optional[Path] = DataDirOpt) -> None:
    """Extract entities again from the memories a failing model left marked for it."""
    with _memory(data_dir) as mem:
        count = mem.reextract(user_id)
        out.print(f"re-extracted {count} memor{'y' if count == 1 else 'ies'}", highlight=False,
                  markup=False)


@app.command(name="mcp")
def mcp_command(
    user: Optional[str] = typer.Option(
        None, "--user", metavar="ID",
        help="Serve one user only: the tools then have no user_id parameter."),
    transport: str = typer.Option(
        "stdio", "--transport", help="stdio (the default) or http (streamable HTTP on 127.0.0.1)."),
    port: int = typer.Option(8765, "--port", min=1, max=65535, help="Port of the http transport."),
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Serve memory tools to MCP clients (agents, IDEs, desktop apps) over stdio or HTTP (needs
    the mcp extra)."""
    if transport not in {"stdio", "http"}:
        raise _fail("--transport: use stdio or http", code=2)
    settings = _settings(data_dir=data_dir)
    try:
        from hybridmem.mcp import run
    except ImportError:
        raise _fail(f"hybridmem mcp needs the mcp extra: {MCP_EXTRA}") from None

    try:
        run(settings, user_id=user, transport=transport, port=port)
    except HybridMemError as exc:
        code = 2 if isinstance(exc, ValueError) else 1
        raise _fail(f"{type(exc).__name__}: {exc}", code=code) from None


# -- the operator's commands: every user of a data dir, or one -------------------------------------
@app.command()
def backup(
    dest: Path = typer.Argument(..., help="The backup folder; snapshots go inside it."),
    user: Optional[str] = UserOpt,
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Snapshot every user (or one) into DEST while the store stays usable; keeps the newest
    HYBRIDMEM_BACKUP_KEEP snapshots there (default 7)."""
    with _memory(data_dir) as mem:
        path = mem.backup(dest, user_id=user)
    manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    if as_json:
        print(json.dumps({"snapshot": str(path), "users": manifest["users"]}, indent=2))
    else:
        count = sum(u["memories"] for u in manifest["users"])
        out.print(f"{path}: {len(manifest['users'])} users, {count} memories",
                  highlight=False, markup=False)


@app.command()
def restore(
    source: Path = typer.Argument(
        ..., help="A snapshot folder, or a backup folder (its newest snapshot)."),
    user: Optional[str] = UserOpt,
    replace: bool = typer.Option(
        False, "--replace", help="Replace users who have memories here (they are erased "
        "first); without it such users are refused."),
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Bring back the users of a snapshot (re-embedded with the configured embedder)."""
    with _memory(data_dir) as mem:
        count = mem.restore(source, user_id=user, replace=replace)
    out.print(f"restored {count} memories", highlight=False, markup=False)


@app.command()
def reembed(
    user: Optional[str] = UserOpt,
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Move memories to the configured embedder (HYBRIDMEM_EMBEDDER); safe to run again
    after an interruption: it resumes where it stopped."""
    from rich.progress import Progress

    with Progress(console=err, transient=False) as bar, _memory(data_dir) as mem:
        tasks: dict[str, int] = {}

        def report(user_id: str, done: int, total: int) -> None:
            if user_id not in tasks:
                tasks[user_id] = int(bar.add_task(f"re-embedding {user_id}", total=total))
            bar.update(tasks[user_id], completed=done)  # type: ignore[arg-type]

        count = mem.reembed(user, progress=report)
    out.print(f"re-embedded {count} memories with {mem.embedder.name}",
              highlight=False, markup=False)


@app.command()
def purge(data_dir: Optional[Path] = DataDirOpt) -> None:
    """Make every erasure physical now (forget, prune and update otherwise leave it to a
    background compaction within HYBRIDMEM_PURGE_DELAY seconds)."""
    with _memory(data_dir) as mem:
        mem.purge_now()
    out.print("purged", highlight=False, markup=False)


def main() -> None:
    """Console-script entry point (no garbage collector for a :data:`ONE_SHOT` command)."""
    gc.disable()  # until _main knows the command
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
