"""A store write run in a thread beside the caller's own, so two fsync'd commits on different
files (the lexical index's SQLite and Chroma's) overlap instead of queueing. Used by
:meth:`hybridmem.write.Writer._run`, which decides when that is safe."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Beside"]


class Beside:
    """``call(*args)`` in a daemon thread, started at once; :meth:`join` hands back its error."""

    def __init__(self, call: Callable[..., object], *args: Any) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(call, args),
                                        name="hybridmem-beside", daemon=True)
        self._thread.start()

    def _main(self, call: Callable[..., object], args: tuple[Any, ...]) -> None:
        try:
            call(*args)
        except BaseException as exc:  # handed to the caller by join
            self._error = exc

    def join(self, *, raising: bool = True) -> bool:
        """Wait for the write; re-raise its error (with ``raising=False``: return whether it
        succeeded instead)."""
        self._thread.join()
        if self._error is not None and raising:
            raise self._error
        return self._error is None
