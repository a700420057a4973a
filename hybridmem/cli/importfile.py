"""Reading the files ``hybridmem import`` takes: rows checked whole before anything is stored.

Accepted formats, by the file's suffix:

- ``.jsonl`` (or any suffix but ``.csv`` and ``.json``): one JSON object per line; blank lines
  are skipped. An object holds the fields of a memory (``text``, ``category``, ``importance``,
  ``metadata``, ...) or is a conversation turn (``role`` and ``content``; ``content`` alone is a
  user's turn).
- ``.csv``: a header naming the same fields; an empty cell is no value, a ``metadata`` column
  holds a JSON object, and any other column is kept as a metadata key (a CSV has no nesting).
- ``.json``: an export bundle of one user (:meth:`hybridmem.Memory.export`), read whole.

Each row is stored under its own ``user_id``; the USER the command is given is the default for
rows without one (and the user of a bundle that names none).

Bad rows: :func:`read_rows` reads and validates the whole file before the command stores
anything. The first bad row raises :class:`ImportFileError` naming ``path:line`` and the problem
(not JSON, not an object, a value beyond the header, no user, a bad user id, a bad field, a
malformed turn); the command prints it as one ``error:`` line and exits 2, and nothing of the
file has been written.

- :class:`ImportFileError` — a file or row that cannot be imported, and where.
- :class:`Row` — one checked row: where it came from, whose it is, and what to store.
- :func:`read_rows` — every row of a JSONL or CSV file, checked.
- :func:`read_bundle` — the user and the content of an export bundle.
- :func:`batches` — rows grouped into the calls that store them, in file order.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridmem import HybridMemError
from hybridmem.models import AddRequest, to_request, validate_user_id

__all__ = [
    "IMPORT_CHUNK",
    "MESSAGE_ROLES",
    "ImportFileError",
    "Row",
    "batches",
    "read_bundle",
    "read_rows",
]

#: Rows per add_many call of ``hybridmem import`` (one embedding batch each).
IMPORT_CHUNK = 256
#: The roles a conversation turn may have.
MESSAGE_ROLES = {"user", "assistant", "system"}

#: CSV columns that are fields of a memory or of a conversation turn; any other column is kept as
#: a metadata key (a CSV has no nesting, so that is where an extra column belongs).
_CSV_FIELDS = set(AddRequest.model_fields) | {"user_id", "role", "content"}


class ImportFileError(ValueError):
    """A file or row that cannot be imported; its message starts with ``path:line`` or ``path``."""


@dataclass(frozen=True)
class Row:
    """One line of an import file: where it came from, whose it is, and what to store.

    Exactly one of ``memory`` (a memory to add) and ``message`` (a conversation turn) is set.
    """

    where: str
    user_id: str
    memory: AddRequest | None
    message: dict[str, str] | None


def _jsonl_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ImportFileError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(value, dict):
                raise ImportFileError(
                    f"{path}:{number}: expected a JSON object, got {type(value).__name__}"
                )
            yield number, value


def _csv_objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, fields) of every row of a CSV file; extra columns go into ``metadata``."""
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        for row in reader:
            number = reader.line_num
            if None in row:  # more values than the header has columns
                extra = row[None]
                raise ImportFileError(
                    f"{path}:{number}: {len(extra)} value(s) beyond the header's "
                    f"{len(reader.fieldnames or [])} columns"
                )

            fields: dict[str, Any] = {}
            metadata: dict[str, Any] = {}
            for key, value in row.items():
                if value in (None, ""):
                    continue
                if key == "metadata":
                    try:
                        extra = json.loads(value)
                    except json.JSONDecodeError:
                        extra = None
                    if not isinstance(extra, dict):
                        raise ImportFileError(
                            f"{path}:{number}: the metadata column must hold a JSON object"
                        )
                    metadata.update(extra)
                elif key in _CSV_FIELDS:
                    fields[key] = value
                else:
                    metadata[key] = value
            if metadata:
                fields["metadata"] = metadata
            yield number, fields


def read_rows(path: Path, default_user: str | None) -> list[Row]:
    """Every row of a JSONL or CSV file, validated before anything is stored: a bad row raises
    :class:`ImportFileError` with its line number, and nothing of the file has been written."""
    objects = _csv_objects(path) if path.suffix.lower() == ".csv" else _jsonl_objects(path)
    rows: list[Row] = []
    for number, obj in objects:
        where = f"{path}:{number}"
        raw_user = obj.pop("user_id", None) or default_user
        if raw_user is None:
            raise ImportFileError(f"{where}: no user_id; add one to the row or pass USER")
        try:
            user_id = validate_user_id(raw_user)
        except HybridMemError as exc:
            raise ImportFileError(f"{where}: {exc}") from None

        if "role" in obj or ("content" in obj and "text" not in obj):  # a conversation turn
            unknown = set(obj) - {"role", "content"}
            role = obj.get("role", "user")
            content = obj.get("content")
            if unknown or role not in MESSAGE_ROLES or not isinstance(content, str):
                raise ImportFileError(
                    f"{where}: a turn is {{\"role\": \"user|assistant|system\", "
                    f"\"content\": \"...\"}}"
                    + (f"; unknown field(s) {sorted(unknown)}" if unknown else "")
                )
            rows.append(Row(where, user_id, None, {"role": role, "content": content}))
        else:
            try:
                rows.append(Row(where, user_id, to_request(obj), None))
            except HybridMemError as exc:
                raise ImportFileError(f"{where}: {exc}") from None
    return rows


def read_bundle(path: Path, default_user: str | None) -> tuple[str, Any]:
    """The user to import into and the parsed content of an export bundle (the Memory checks
    the content itself). ``default_user`` wins over the bundle's own ``user_id``."""
    try:
        bundle = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ImportFileError(f"{path}: not JSON ({exc})") from None
    user = default_user or (bundle.get("user_id") if isinstance(bundle, dict) else None)
    if not isinstance(user, str):
        raise ImportFileError(f"{path} names no user_id; pass USER")
    return user, bundle


def batches(rows: list[Row]) -> Iterator[tuple[str, list[Row]]]:
    """Consecutive rows of one user and one kind (memories or turns), at most IMPORT_CHUNK each,
    so each row is stored in file order under its own user."""
    batch: list[Row] = []
    for row in rows:
        if batch:
            other_user = row.user_id != batch[0].user_id
            other_kind = (row.message is None) != (batch[0].message is None)
            if other_user or other_kind or len(batch) == IMPORT_CHUNK:
                yield batch[0].user_id, batch
                batch = []
        batch.append(row)
    if batch:
        yield batch[0].user_id, batch
