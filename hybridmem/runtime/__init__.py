"""What every store stands on: files written atomically inside ``data_dir``, and every lock.

- :mod:`~hybridmem.runtime.files` — hashed per-user directories, atomic writes.
- :mod:`~hybridmem.runtime.locks` — the data-dir lock and the per-user locks.

Imports the ground floor only.
"""
