"""The ``hybridmem`` command: a thin layer over :class:`~hybridmem.Memory`.

Errors print one clear line on stderr and exit non-zero; ``--json`` prints machine-readable output.
"""

from __future__ import annotations

import csv
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from pydantic import ValidationError

from hybridmem import HybridMemError, Hit, Memory, Settings
from hybridmem.models import pydantic_message

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
out = Console()
err = Console(stderr=True)

DataDirOpt = typer.Option(None, "--data-dir", help="Where memories live (HYBRIDMEM_DATA_DIR).")
JsonOpt = typer.Option(False, "--json", help="Print JSON.")


@contextmanager
def _memory(data_dir: Optional[Path], **overrides: Any) -> Iterator[Memory]:
    """Open a Memory from settings (env) with CLI overrides; turn our errors into one line."""
    try:
        fields = {k: v for k, v in overrides.items() if v is not None}
        if data_dir is not None:
            fields["data_dir"] = data_dir
        with Memory(Settings(**fields)) as mem:
            yield mem
    except HybridMemError as exc:
        err.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(code=1) from None
    except ValidationError as exc:  # settings validation: name the setting and the problem
        err.print(f"error: invalid setting: {pydantic_message(exc.errors())}",
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(code=2) from None


def _hits_table(title: str, hits: list[Hit]) -> Table:
    table = Table(title=title, title_justify="left", show_lines=False, expand=True)
    table.add_column("score", justify="right", width=7)
    table.add_column("memory", ratio=3)
    table.add_column("why", ratio=2, style="dim")
    for hit in hits:
        table.add_row(f"{hit.score:.4f}", hit.item.text, hit.why)
    return table


def _load_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise typer.BadParameter(f"{path}:{number}: not JSON ({exc.msg})") from None
    return rows


@app.command()
def demo(
    data: Path = typer.Option(Path("data"), "--data", help="The demo data folder."),
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Keep the demo store here (default: a temporary folder)."
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Load the shipped e-commerce sample and run its demo queries, offline."""
    memories, queries = data / "memories.jsonl", data / "demo_queries.json"
    if not memories.is_file() or not queries.is_file():
        err.print(f"error: {data} has no memories.jsonl/demo_queries.json; run from the repo root "
                  "or pass --data PATH")
        raise typer.Exit(code=1)
    with tempfile.TemporaryDirectory(prefix="hybridmem-demo-") as tmp:
        target = data_dir or Path(tmp)
        with _memory(target) as mem:
            rows = _load_jsonl(memories)
            started = time.perf_counter()
            by_user: dict[str, list[dict[str, Any]]] = {}
            for row in rows:
                by_user.setdefault(row.pop("user_id"), []).append(row)
            for user_id, items in by_user.items():
                mem.add_many(user_id, items)
            took = time.perf_counter() - started
            results = []
            for q in json.loads(queries.read_text(encoding="utf-8")):
                hits = mem.search(q["user_id"], q["query"], limit=3)
                results.append((q, hits))
            if as_json:
                print(json.dumps([
                    {"user_id": q["user_id"], "query": q["query"],
                     "hits": [h.model_dump(mode="json") for h in hits]}
                    for q, hits in results
                ], indent=2))
                return
            out.print(f"Loaded {len(rows)} memories of {len(by_user)} customers in {took:.1f}s "
                      f"(embedder {mem.embedder.name}, extractor "
                      f"{mem.extractor.name if mem.extractor else 'none'}, offline)\n")
            for q, hits in results:
                out.print(_hits_table(f"{q['user_id']}: {q['query']}", hits))
            first = results[0][0]
            ctx = mem.context(first["user_id"], first["query"], max_tokens=200)
            out.print(f"\n[bold]context for {first['user_id']!r}[/bold] "
                      f"({ctx.tokens}/{ctx.max_tokens} tokens, {ctx.encoding}):")
            out.print(ctx.text, highlight=False, markup=False)


@app.command()
def add(
    user_id: str,
    text: str,
    category: str = typer.Option("general", help="Category of the memory."),
    importance: float = typer.Option(0.5, min=0.0, max=1.0),
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Store one memory."""
    with _memory(data_dir) as mem:
        item = mem.add(user_id, text, category=category, importance=importance)
        print(item.model_dump_json() if as_json else item.id)


@app.command(name="import")
def import_cmd(
    user_id: str,
    path: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True),
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Import memories from JSONL (one object with 'text' per line), CSV (a 'text' column) or an
    export JSON."""
    with _memory(data_dir) as mem:
        if path.suffix == ".json":
            count = mem.import_(user_id, json.loads(path.read_text(encoding="utf-8")))
        else:
            if path.suffix == ".csv":
                with path.open(encoding="utf-8", newline="") as handle:
                    rows: list[dict[str, Any]] = [
                        {k: v for k, v in row.items() if v not in (None, "")}
                        for row in csv.DictReader(handle)
                    ]
            else:
                rows = _load_jsonl(path)
            for row in rows:
                row.pop("user_id", None)
            count = 0
            from rich.progress import track

            for start in track(range(0, len(rows), 256), description="importing", console=err):
                count += len(mem.add_many(user_id, rows[start : start + 256]))
        out.print(f"imported {count} memories into {user_id}")


@app.command()
def search(
    user_id: str,
    query: str,
    limit: int = typer.Option(5, min=1, max=1000),
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Hybrid search of a user's memories, with the reason for each hit."""
    with _memory(data_dir) as mem:
        hits = mem.search(user_id, query, limit=limit)
        if as_json:
            print(json.dumps([h.model_dump(mode="json") for h in hits], indent=2))
        else:
            out.print(_hits_table(query, hits))


@app.command()
def context(
    user_id: str,
    query: str,
    max_tokens: int = typer.Option(600, min=1),
    data_dir: Optional[Path] = DataDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """The token-bounded context that would be sent to the model."""
    with _memory(data_dir) as mem:
        ctx = mem.context(user_id, query, max_tokens=max_tokens)
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
    """Answer a message with memory, through the configured endpoint (HYBRIDMEM_BASE_URL ...)."""
    with _memory(data_dir) as mem:
        reply = mem.chat(user_id, message)
        print(reply.model_dump_json(indent=2) if as_json else reply.text)


@app.command()
def forget(
    user_id: str,
    memory_id: Optional[str] = typer.Argument(None),
    data_dir: Optional[Path] = DataDirOpt,
) -> None:
    """Delete one memory, or everything of a user."""
    with _memory(data_dir) as mem:
        removed = mem.forget(user_id, memory_id)
        out.print(f"removed {removed} memor{'y' if removed == 1 else 'ies'}")


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


def _is_loopback(host: str) -> bool:
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
    """Run the REST service (bearer keys: HYBRIDMEM_SERVER_API_KEY, comma-separated)."""
    import logging

    if log_level.lower() not in {"debug", "info", "warning", "error"}:
        raise typer.BadParameter("use debug, info, warning or error", param_hint="--log-level")
    try:
        settings = Settings() if data_dir is None else Settings(data_dir=data_dir)
    except ValidationError as exc:
        err.print(f"error: invalid setting: {pydantic_message(exc.errors())}",
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(code=2) from None
    if not settings.server_keys() and not _is_loopback(host):
        err.print(f"error: refusing to serve on {host} without an API key; set "
                  "HYBRIDMEM_SERVER_API_KEY (comma-separated for several) or use --host 127.0.0.1",
                  highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(code=2)
    import uvicorn

    from hybridmem.server import create_app

    level = getattr(logging, log_level.upper(), logging.INFO)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("hybridmem").addHandler(handler)
    logging.getLogger("hybridmem").setLevel(level)
    with _memory(data_dir) as mem:
        # One worker: the embedded store belongs to this process; requests run in its threadpool.
        # uvicorn's access log is off: hybridmem.server logs route templates, not user ids.
        uvicorn.run(create_app(mem), host=host, port=port, log_level=log_level.lower(),
                    access_log=False)


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:  # pragma: no cover
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
