"""An in-memory index of workloads and records: the storage behind MemoryDatabase and
JSONDatabase, which only adds writing each commit to disk (the ``_write_*`` hooks).

Workloads sit in a list whose positions are MetaSchedule's workload indices (for JSONDatabase,
the line numbers of ``database_workload.json``; a line that failed to load leaves a hole).
Workloads equal under the database's module equality form a group, keyed by the position of its
first member; queries and ``get_top_k`` work on groups. A record always keeps the workload whose
module its trace was made for (under ``"anchor-block"`` a group may hold several modules).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import tvm
import tvm_ffi
from tvm import tirx

from ..utils import RelaxTuneError, normalize_mod, target_compatible
from .base import Database, query_target_config, rank
from .records import TuningRecord, Workload
from .validate import check_args_info, workload_args


def try_normalize(mod: tvm.IRModule) -> tvm.IRModule:
    """``utils.normalize_mod(mod)``, or ``mod`` unchanged when it is not a one-PrimFunc module."""
    try:
        return normalize_mod(mod)
    except RelaxTuneError:
        return mod


class IndexedDatabase(Database):
    """A database whose workloads and records are held in memory and indexed for lookups.

    Subclasses persist commits by overriding ``_write_workload`` and ``_write_record``, which
    run before the in-memory state changes (so a failed write leaves both unchanged)."""

    def __init__(self, module_equality: str = "structural") -> None:
        super().__init__(module_equality)
        self._workloads: list[Workload | None] = []  # position = workload index; None = hole
        self._group: list[int] = []  # workload index -> index of its group's first workload
        self._by_hash: dict[int, list[int]] = {}  # equality hash -> distinct workload indices
        self._index_of: dict[int, int] = {}  # id(Workload) -> index, for workloads held here
        self._records: list[TuningRecord] = []
        self._group_records: dict[int, list[TuningRecord]] = {}
        self._ranked: dict[int, list[TuningRecord]] = {}  # group -> valid records, best first
        self._args: dict[int, list | None] = {}  # workload index -> its arguments (validate)

    # ------------------------------------------------------------------ persistence hooks
    def _write_workload(self, workload: Workload, index: int) -> None:
        """Persist a new workload at ``index`` (nothing to do in memory)."""

    def _write_record(self, record: TuningRecord, index: int) -> None:
        """Persist a record of the workload at ``index`` (nothing to do in memory)."""

    # ------------------------------------------------------------------ index
    def _find_group(self, mod: tvm.IRModule, shash: int) -> int | None:
        for idx in self._by_hash.get(shash, ()):
            if self._equality.equal(self._workloads[idx].mod, mod):  # type: ignore[union-attr]
                return self._group[idx]
        return None

    def _find_exact(self, mod: tvm.IRModule, shash: int) -> int | None:
        for idx in self._by_hash.get(shash, ()):
            other = self._workloads[idx].mod  # type: ignore[union-attr]
            if other is mod or tvm_ffi.structural_equal(other, mod):
                return idx
        return None

    def _add_hole(self) -> None:
        """Reserve a workload index for a line that could not be loaded."""
        self._workloads.append(None)
        self._group.append(-1)

    def _add_workload(self, workload: Workload) -> int:
        """Index ``workload`` at the next position (an exact duplicate of a stored workload
        becomes an alias of it); return the position of the workload records should use."""
        index = len(self._workloads)
        exact = self._find_exact(workload.mod, workload.shash)
        if exact is not None:
            self._workloads.append(self._workloads[exact])
            self._group.append(self._group[exact])
            return exact
        group = self._find_group(workload.mod, workload.shash)
        self._workloads.append(workload)
        self._group.append(index if group is None else group)
        self._by_hash.setdefault(workload.shash, []).append(index)
        self._index_of[id(workload)] = index
        return index

    def _check_args(self, record: TuningRecord, index: int) -> None:
        """RelaxTuneError unless ``record``'s arguments are those of the workload at
        ``index`` (``validate.check_args_info``)."""
        if record.args_info is None:
            return
        if index not in self._args:
            self._args[index] = workload_args(self._workloads[index].mod)  # type: ignore
        check_args_info(record.args_info, self._args[index])

    def _add_record(self, record: TuningRecord, index: int) -> None:
        group = self._group[index]
        self._records.append(record)
        self._group_records.setdefault(group, []).append(record)
        self._ranked.pop(group, None)

    def _index_for(self, workload: Workload) -> int | None:
        """The position of the stored workload with exactly ``workload``'s (normalised) module,
        or None."""
        index = self._index_of.get(id(workload))
        if index is not None and self._workloads[index] is workload:
            return index
        mod = try_normalize(workload.mod)
        return self._find_exact(mod, self._equality.hash(mod))

    def _group_for(self, workload: Workload) -> int | None:
        """The group of the stored workloads equal to ``workload``, or None."""
        index = self._index_of.get(id(workload))
        if index is not None and self._workloads[index] is workload:
            return self._group[index]
        mod = try_normalize(workload.mod)
        return self._find_group(mod, self._equality.hash(mod))

    def _ranked_group(self, group: int) -> list[TuningRecord]:
        ranked = self._ranked.get(group)
        if ranked is None:
            ranked = self._ranked[group] = rank(self._group_records.get(group, ()))
        return ranked

    def _new_workload(self, mod: tvm.IRModule, shash: int) -> int:
        """Write and index a workload not stored yet; return its position."""
        workload = Workload(mod, shash)
        self._write_workload(workload, len(self._workloads))
        return self._add_workload(workload)

    # ------------------------------------------------------------------ Database
    def has_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> bool:
        """True when a workload equal to ``mod`` (normalised) is stored."""
        mod = normalize_mod(mod)
        return self._find_group(mod, self._equality.hash(mod)) is not None

    def commit_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> Workload:
        """Store ``mod`` (normalised) as a workload unless an equal one is stored; return the
        stored one."""
        mod = normalize_mod(mod)
        shash = self._equality.hash(mod)
        group = self._find_group(mod, shash)
        index = self._new_workload(mod, shash) if group is None else group
        return self._workloads[index]  # type: ignore[return-value]

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Store ``record`` against the workload with exactly its module, adding that workload
        when missing; the stored record refers to this database's Workload object.
        RelaxTuneError when its ``args_info`` are not that workload's arguments."""
        index = self._index_for(record.workload)
        if index is None:
            mod = try_normalize(record.workload.mod)
            index = self._new_workload(mod, self._equality.hash(mod))
        workload = self._workloads[index]
        self._check_args(record, index)
        if workload is not record.workload:
            record = TuningRecord(record.trace_json, workload, record.run_secs,  # type: ignore
                                  record.target_config, record.args_info)
        self._write_record(record, index)
        self._add_record(record, index)

    def get_top_k(self, workload: Workload, top_k: int,
                  target: tvm.target.Target | dict | str | None = None) -> list[TuningRecord]:
        """Up to ``top_k`` valid records of ``workload``'s group, fastest first; with
        ``target``, only records made for a compatible target."""
        if top_k < 0:
            raise RelaxTuneError(f"top_k must be non-negative, not {top_k}")
        group = self._group_for(workload)
        if group is None or top_k == 0:
            return []
        ranked = self._ranked_group(group)
        if target is None:
            return ranked[:top_k]
        config = query_target_config(target)
        return list(itertools.islice(
            (rec for rec in ranked if target_compatible(rec.target_config, config)), top_k))

    def get_records(self, workload: Workload) -> list[TuningRecord]:
        """All records of ``workload``'s group, failed ones included, in commit order."""
        group = self._group_for(workload)
        return [] if group is None else list(self._group_records.get(group, ()))

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """All records, in commit (file) order."""
        return list(self._records)

    def get_all_workloads(self) -> list[Workload]:
        """The distinct stored workloads, with or without records, in commit (file) order."""
        return [wl for idx, wl in enumerate(self._workloads)
                if wl is not None and self._index_of.get(id(wl)) == idx]

    def __len__(self) -> int:
        """The number of records."""
        return len(self._records)

    def _find_workload(self, mod: tvm.IRModule, raw: tvm.IRModule | None = None,
                       ) -> tuple[Workload, tvm.IRModule] | None:
        group = self._find_group(mod, self._equality.hash(mod))
        return None if group is None else (self._workloads[group], mod)  # type: ignore

    def _candidates(self, mod: tvm.IRModule, target: dict | None, workload_name: str,
                    raw: tvm.IRModule | None = None,
                    ) -> tuple[tvm.IRModule, Iterator[TuningRecord]]:
        group = self._find_group(mod, self._equality.hash(mod))
        if group is None:
            return mod, iter(())
        return mod, (rec for rec in self._ranked_group(group)
                     if target_compatible(rec.target_config, target))
