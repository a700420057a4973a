"""What every store stands on: files written atomically inside ``data_dir``, every lock, and
the process-wide tricks the stores need.

- :mod:`~hybridmem.runtime.files` — hashed per-user directories, atomic writes.
- :mod:`~hybridmem.runtime.locks` — the data-dir lock, the per-user locks, the users' write locks.
- :mod:`~hybridmem.runtime.process` — heap scrubbing and release, the open-file budget.

Imports the ground floor only.
"""
