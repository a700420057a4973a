"""Backups with rotation: consistent snapshots of every user (or one), the last N kept.

A snapshot is *logical*: one :meth:`Memory.export` bundle per user (memories with every field,
key facts, graph, history), each taken under that user's lock, so no user is ever copied in the
middle of a write — whatever the stores are (embedded files or a Chroma server). Users are
snapshotted one after another: each is consistent in itself, and a write to another user during
the backup lands in it or not, never half. Vectors are not copied: a restore re-embeds with the
configured embedder (see :mod:`hybridmem.ops.bundle`).

Layout, under the backup folder ``dest``::

    dest/hybridmem-20261201T013000123456Z/
        manifest.json            format, version, time, embedder, and per user: file, memories,
                                 sha256 of the file
        users/u-<sha256 of the user id>.json

A snapshot is written under ``dest/.partial-<name>-<pid>/`` (each file temp + fsync + replace) and
renamed into place at the end, so a crash leaves no snapshot that looks complete; rotation counts
only finished snapshots and deletes the oldest beyond ``keep``. :func:`load_snapshot` checks every
checksum before anything is restored.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridmem.runtime.files import atomic_write_bytes, user_key
from hybridmem.errors import InvalidInputError, NotFoundError
from hybridmem.models import utcnow

__all__ = ["MANIFEST", "SNAPSHOT_PREFIX", "Snapshot", "load_snapshot", "rotate", "snapshots",
           "write_snapshot"]

SNAPSHOT_PREFIX = "hybridmem-"
PARTIAL_PREFIX = ".partial-"
MANIFEST = "manifest.json"
FORMAT = "hybridmem-backup"
VERSION = 1


@dataclass(frozen=True)
class Snapshot:
    """A finished snapshot: its folder, when it was taken and which users it holds."""

    path: Path
    created_at: str
    users: dict[str, int]  # user id -> memories

    def __repr__(self) -> str:
        return f"Snapshot({self.path.name}, users={len(self.users)})"


def snapshots(dest: Path) -> list[Path]:
    """The finished snapshots in ``dest``, oldest first (their names sort by time)."""
    if not dest.is_dir():
        return []
    return sorted(p for p in dest.iterdir()
                  if p.is_dir() and p.name.startswith(SNAPSHOT_PREFIX) and (p / MANIFEST).is_file())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _clear_partials(dest: Path) -> None:
    """Remove what crashed backups left (a partial folder whose process is gone)."""
    for path in dest.glob(PARTIAL_PREFIX + "*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue  # that backup is still running
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
        shutil.rmtree(path, ignore_errors=True)


def write_snapshot(
    dest: Path,
    bundles: Iterable[tuple[str, dict[str, Any]]],
    *,
    embedder: str,
    keep: int,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write one snapshot of ``bundles`` (user id, export bundle) into ``dest``, then keep only
    the ``keep`` newest snapshots there. Returns the snapshot's folder."""
    dest.mkdir(parents=True, exist_ok=True)
    _clear_partials(dest)
    now = utcnow()
    name = SNAPSHOT_PREFIX + now.strftime("%Y%m%dT%H%M%S%fZ")
    while (dest / name).exists():  # two backups within one microsecond
        name += "-"
    partial = dest / f"{PARTIAL_PREFIX}{name}-{os.getpid()}"
    (partial / "users").mkdir(parents=True)
    users: list[dict[str, Any]] = []
    try:
        for user_id, bundle in bundles:
            data = json.dumps(bundle, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
            file = f"users/{user_key(user_id)}.json"
            atomic_write_bytes(partial / file, data)
            users.append({"user_id": user_id, "file": file,
                          "memories": len(bundle.get("memories", [])),
                          "sha256": hashlib.sha256(data).hexdigest()})
            if progress is not None:
                progress(user_id)
        manifest = {"format": FORMAT, "version": VERSION, "created_at": now.isoformat(),
                    "embedder": embedder, "users": users}
        atomic_write_bytes(partial / MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
        os.replace(partial, dest / name)
        _fsync_dir(dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    rotate(dest, keep)
    return dest / name


def rotate(dest: Path, keep: int) -> list[Path]:
    """Delete the oldest finished snapshots beyond ``keep``; returns what was deleted."""
    if keep < 1:
        raise InvalidInputError("keep must be at least 1")
    doomed = snapshots(dest)[:-keep]
    for path in doomed:
        shutil.rmtree(path)
    return doomed


def load_snapshot(source: Path, *, user_id: str | None = None
                  ) -> tuple[Snapshot, Iterator[tuple[str, dict[str, Any]]]]:
    """The snapshot at ``source`` (a snapshot folder, or a backup folder: its newest snapshot)
    and its bundles (all users', or ``user_id``'s). Every file's checksum is verified first:
    a damaged snapshot is refused before anything is restored."""
    folder = source
    if not (source / MANIFEST).is_file():
        found = snapshots(source)
        if not found:
            raise NotFoundError(f"{source} holds no hybridmem snapshot")
        folder = found[-1]
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
        entries = [e for e in manifest["users"] if user_id is None or e["user_id"] == user_id]
        if manifest.get("format") != FORMAT:
            raise ValueError("not a hybridmem backup manifest")
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidInputError(f"{folder / MANIFEST} is not a valid manifest: {exc}") from exc
    if user_id is not None and not entries:
        raise NotFoundError(f"snapshot {folder.name} holds no user {user_id!r}")
    for entry in entries:
        data = (folder / entry["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise InvalidInputError(
                f"{folder / entry['file']} does not match its checksum; the snapshot is damaged")

    def bundles() -> Iterator[tuple[str, dict[str, Any]]]:
        for entry in entries:
            yield entry["user_id"], json.loads((folder / entry["file"]).read_bytes())

    snap = Snapshot(folder, str(manifest.get("created_at", "")),
                    {e["user_id"]: int(e["memories"]) for e in entries})
    return snap, bundles()
