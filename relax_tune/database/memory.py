"""MemoryDatabase: workloads and records held in memory only (tests, scratch tuning)."""

from __future__ import annotations

from .indexed import IndexedDatabase


class MemoryDatabase(IndexedDatabase):
    """A database that keeps everything in memory and forgets it when dropped.

    ``module_equality``: ``"structural"`` (default), ``"ignore-tensor"`` or ``"anchor-block"``.
    """

    def __init__(self, module_equality: str = "structural") -> None:
        super().__init__(module_equality)

    def __repr__(self) -> str:
        return f"MemoryDatabase({len(self)} records, module_equality={self.module_equality!r})"
