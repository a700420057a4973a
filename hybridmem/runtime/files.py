"""Safe files: per-user directories derived from a hash, atomic writes, per-user file locks.

A user id never becomes a path raw: the directory name is a hash of it, and the resolved path is
checked to stay inside ``data_dir`` anyway. Only the user's own folder is named after (a hash of)
the user, and forgetting the user removes it: lock files are a fixed set of stripes shared by all
users (:func:`user_lock`), so no file name outlives a forgotten user.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock

from hybridmem.errors import InvalidUserIdError, StorageError
from hybridmem.models import validate_user_id

__all__ = ["LOCK_STRIPES", "USER_KEY", "atomic_write_bytes", "check_users_dir", "remove_tree",
           "user_key", "user_dir", "user_lock"]

#: How many lock files a data directory has; users share them by the hash of their id.
LOCK_STRIPES = 64


#: What every :func:`user_key` looks like.
USER_KEY = re.compile(r"u-[0-9a-f]{40}")


def user_key(user_id: str) -> str:
    """A stable name for ``user_id`` usable as a directory and Chroma collection name."""
    validate_user_id(user_id)
    return "u-" + hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:40]


def user_dir(data_dir: Path, user_id: str, *, create: bool = True) -> Path:
    """The directory holding ``user_id``'s files, always inside ``data_dir/users``."""
    root = (data_dir / "users").resolve()
    path = (root / user_key(user_id)).resolve()
    if path.parent != root:
        raise InvalidUserIdError("user_id would resolve outside the data directory")
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def check_users_dir(data_dir: Path, what: str) -> None:
    """Raise :class:`StorageError` unless the users' files can be written: ``data_dir/users``,
    or before the first user ``data_dir`` itself, is a directory this process may write to. Creates
    nothing (a readiness probe must not)."""
    root = data_dir / "users"
    where = root if root.exists() else data_dir
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        raise StorageError(f"the {what} cannot write its files in {where}: check that the "
                           "directory exists and this process may write to it")


def user_lock(data_dir: Path, user_id: str) -> FileLock:
    """A cross-process lock for ``user_id``'s files.

    One of :data:`LOCK_STRIPES` lock files (``locks/stripe-NN.lock``), chosen by the hash of the
    user id, and all of them are created together: which files exist says nothing about which
    users exist or existed (a file per user would outlive the user's erasure, since a lock file
    cannot be deleted safely while another process may wait on it). Two users sharing a stripe
    only wait for each other; never hold two users' locks at once.
    """
    locks = data_dir / "locks"
    stripe = int(user_key(user_id)[2:], 16) % LOCK_STRIPES
    path = locks / f"stripe-{stripe:02d}.lock"
    if not path.exists():
        locks.mkdir(parents=True, exist_ok=True)
        for n in range(LOCK_STRIPES):
            (locks / f"stripe-{n:02d}.lock").touch(exist_ok=True)
        # earlier versions named a lock file after each user, forgotten ones included: drop them
        # (stop processes of the old version before upgrading a data directory)
        for legacy in locks.glob("u-*.lock"):
            legacy.unlink(missing_ok=True)
    return FileLock(str(path), thread_local=False)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old or the new file, whole.

    Temp file in the same directory, fsync, ``os.replace``, then fsync of the directory.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StorageError(f"could not write {path}: {exc}") from exc
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_tree(path: Path) -> None:
    """Remove a directory tree if it exists."""
    if path.exists():
        shutil.rmtree(path)
