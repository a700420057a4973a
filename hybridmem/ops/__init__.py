"""Operator jobs on whole users or the whole data dir.

- :mod:`~hybridmem.ops.bundle` — export and import of a user as a bundle (crash-safe import).
- :mod:`~hybridmem.ops.backup` — backup and restore of the data dir.

Imports the ground floor and the store wings.
"""
