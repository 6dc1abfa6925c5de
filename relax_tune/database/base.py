"""The database interface: storage methods subclasses implement, and the queries built on them.

Queries (``query_tuning_record``, ``query_schedule``, ``query_ir_module``, ``query``) normalise
the function they are given with ``utils.normalize_mod``, so a PrimFunc taken from a Relax
module finds the records tuned for it. They only return records made for a target compatible
with the query's (``utils.target_compatible``; a record without a target matches any), and they
never raise because a stored trace fails to replay: that record is skipped with a warning and the
next best one is tried.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Literal

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule

from ..utils import RelaxTuneError, normalize_mod, parse_target, structural_hash, target_compatible, \
    target_config
from .equality import ModuleEquality
from .records import TuningRecord, Workload

logger = logging.getLogger("relax_tune.database")

_SCOPE = threading.local()

QueryKind = Literal["schedule", "record", "ir_module"]


def _scope_stack() -> list[Database]:
    stack = getattr(_SCOPE, "stack", None)
    if stack is None:
        stack = _SCOPE.stack = []
    return stack


def query_target_config(target: Any) -> dict | None:
    """The JSON dict of a query's target: ``target`` itself (Target, string or dict), else the
    ``with target:`` scope, else None (then every record matches)."""
    if target is None:
        target = tvm.target.Target.current(allow_none=True)
        if target is None:
            return None
    if isinstance(target, dict):
        return target
    return target_config(parse_target(target))


def rank(records: Iterable[TuningRecord], target: dict | None = None) -> list[TuningRecord]:
    """The valid records among ``records`` that suit ``target``, fastest first (ties keep order)."""
    valid = [rec for rec in records
             if rec.is_valid and target_compatible(rec.target_config, target)]
    valid.sort(key=lambda rec: rec.mean_run_secs)
    return valid


class Database:
    """Where tuning records live. Subclasses implement the storage methods (``has_workload``,
    ``commit_workload``, ``commit_tuning_record``, ``get_top_k``, ``get_records``,
    ``get_all_tuning_records``, ``__len__``); the queries, ``dump_pruned`` and the ``with db:``
    scope are shared.

    ``module_equality`` says when two workloads are the same: ``"structural"`` (default),
    ``"ignore-tensor"`` or ``"anchor-block"`` (see ``relax_tune.database.equality``).
    """

    def __init__(self, module_equality: str = "structural") -> None:
        self._equality = ModuleEquality(module_equality)
        self.module_equality: str = self._equality.name

    # ------------------------------------------------------------------ storage (subclasses)
    def has_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> bool:
        """True when the database holds a workload equal to ``mod`` (normalised first)."""
        raise NotImplementedError(f"{type(self).__name__}.has_workload")

    def commit_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> Workload:
        """Add ``mod`` (normalised) as a workload; return the existing Workload when an equal one
        is already stored."""
        raise NotImplementedError(f"{type(self).__name__}.commit_workload")

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Add a record; its workload is committed first when the database lacks it."""
        raise NotImplementedError(f"{type(self).__name__}.commit_tuning_record")

    def get_top_k(self, workload: Workload, top_k: int,
                  target: tvm.target.Target | dict | str | None = None) -> list[TuningRecord]:
        """Up to ``top_k`` valid records of ``workload``, fastest first; with ``target``, only
        records made for a compatible target."""
        raise NotImplementedError(f"{type(self).__name__}.get_top_k")

    def get_records(self, workload: Workload) -> list[TuningRecord]:
        """Every record of ``workload``, failed ones included, in commit order (what a resumed
        tuner needs so as not to measure the same trace twice)."""
        raise NotImplementedError(f"{type(self).__name__}.get_records")

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """Every record in the database, in commit (file) order."""
        raise NotImplementedError(f"{type(self).__name__}.get_all_tuning_records")

    def __len__(self) -> int:
        """The number of tuning records."""
        raise NotImplementedError(f"{type(self).__name__}.__len__")

    def __bool__(self) -> bool:
        """A database is always truthy, even when empty (so ``db or default`` behaves)."""
        return True

    # ------------------------------------------------------------------ queries
    def _find_workload(self, mod: tvm.IRModule) -> Workload | None:
        """The stored workload equal to the normalised ``mod``, or None."""
        return self.commit_workload(mod) if self.has_workload(mod) else None

    def _candidates(self, mod: tvm.IRModule, target: dict | None,
                    workload_name: str) -> Iterator[TuningRecord]:
        """Valid, target-compatible records for the normalised ``mod``, best first."""
        workload = self._find_workload(mod)
        if workload is None:
            return iter(())
        return iter(self.get_top_k(workload, max(len(self), 1), target))

    def query_tuning_record(self, mod: tvm.IRModule | tirx.PrimFunc,
                            target: tvm.target.Target | dict | str | None = None,
                            workload_name: str = "main") -> TuningRecord | None:
        """The best valid record of ``mod`` for ``target`` whose trace replays, or None.

        ``target`` None means the ``with target:`` scope, or any target outside one."""
        query_mod = normalize_mod(mod)
        for record in self._candidates(query_mod, query_target_config(target), workload_name):
            if record.check_trace() is None:
                return record
        return None

    def query_schedule(self, mod: tvm.IRModule | tirx.PrimFunc,
                       target: tvm.target.Target | dict | str | None = None,
                       workload_name: str = "main") -> Schedule | None:
        """The best schedule of ``mod`` for ``target``: the best record's trace replayed on the
        query's (normalised) module, or None. Records whose trace does not replay are skipped."""
        query_mod = normalize_mod(mod)
        for record in self._candidates(query_mod, query_target_config(target), workload_name):
            sch = replay_on(record, query_mod)
            if sch is not None:
                return sch
        return None

    def query_ir_module(self, mod: tvm.IRModule | tirx.PrimFunc,
                        target: tvm.target.Target | dict | str | None = None,
                        workload_name: str = "main") -> tvm.IRModule | None:
        """The module of ``query_schedule``'s schedule, or None."""
        sch = self.query_schedule(mod, target, workload_name)
        return None if sch is None else sch.mod

    def query(self, mod: tvm.IRModule | tirx.PrimFunc,
              target: tvm.target.Target | dict | str | None = None,
              workload_name: str = "main", kind: QueryKind = "schedule",
              ) -> Schedule | tvm.IRModule | TuningRecord | None:
        """``query_schedule``, ``query_tuning_record`` or ``query_ir_module`` by ``kind``
        (``"schedule"``, ``"record"``, ``"ir_module"``)."""
        if kind == "schedule":
            return self.query_schedule(mod, target, workload_name)
        if kind == "record":
            return self.query_tuning_record(mod, target, workload_name)
        if kind == "ir_module":
            return self.query_ir_module(mod, target, workload_name)
        raise RelaxTuneError(f"unknown query kind {kind!r}; use 'schedule', 'record' or "
                             "'ir_module'")

    # ------------------------------------------------------------------ maintenance
    def get_all_workloads(self) -> list[Workload]:
        """The distinct workloads the records refer to, in first-seen order (databases that
        store workloads also list those without records)."""
        seen: dict[int, Workload] = {}
        for record in self.get_all_tuning_records():
            seen.setdefault(id(record.workload), record.workload)
        return list(seen.values())

    def dump_pruned(self, destination: Database) -> None:
        """Commit to ``destination`` the best valid record of every distinct workload module
        (structurally distinct, whatever this database's module equality), in first-seen order."""
        best: list[TuningRecord] = []
        slots: dict[int, list[int]] = {}  # structural hash -> positions in ``best``
        hashes: dict[int, int] = {}  # id(module) -> structural hash
        for record in self.get_all_tuning_records():
            if not record.is_valid:
                continue
            mod = record.workload.mod
            if id(mod) not in hashes:
                hashes[id(mod)] = structural_hash(mod)
            bucket = slots.setdefault(hashes[id(mod)], [])
            for pos in bucket:
                other = best[pos].workload.mod
                if other is mod or tvm_ffi.structural_equal(other, mod):
                    if record.mean_run_secs < best[pos].mean_run_secs:
                        best[pos] = record
                    break
            else:
                bucket.append(len(best))
                best.append(record)
        for record in best:
            workload = destination.commit_workload(record.workload.mod)
            if workload.mod is not record.workload.mod and \
                    not tvm_ffi.structural_equal(workload.mod, record.workload.mod):
                workload = record.workload  # an anchor-block match: keep the record's own module
            destination.commit_tuning_record(TuningRecord(
                record.trace_json, workload, record.run_secs, record.target_config,
                record.args_info))

    # ------------------------------------------------------------------ scope
    def __enter__(self) -> Database:
        """Make this the current database (``Database.current()``) inside a ``with`` block."""
        _scope_stack().append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        stack = _scope_stack()
        if stack and stack[-1] is self:
            stack.pop()
        elif self in stack:
            stack.remove(self)

    @staticmethod
    def current() -> Database | None:
        """The database of the innermost ``with db:`` block of this thread, or None."""
        stack = _scope_stack()
        return stack[-1] if stack else None

    @staticmethod
    def create(kind: str | Any = "json", *args: Any, **kwargs: Any) -> Database:
        """A database by name, as MetaSchedule's ``Database.create``: ``"json"``, ``"memory"``,
        ``"union"``, ``"ordered_union"``, or a schedule function (-> ScheduleFnDatabase)."""
        from .json_database import JSONDatabase
        from .memory import MemoryDatabase
        from .schedule_fn import ScheduleFnDatabase
        from .union import OrderedUnionDatabase, UnionDatabase

        if callable(kind):
            return ScheduleFnDatabase(kind, *args, **kwargs)
        kinds: dict[str, type[Database]] = {
            "json": JSONDatabase, "memory": MemoryDatabase,
            "union": UnionDatabase, "ordered_union": OrderedUnionDatabase}
        if kind not in kinds:
            raise RelaxTuneError(f"unknown database kind {kind!r}; use one of "
                                 f"{', '.join(kinds)} or a schedule function")
        return kinds[kind](*args, **kwargs)


def replay_on(record: TuningRecord, mod: tvm.IRModule) -> Schedule | None:
    """``record``'s trace replayed on ``mod``, or None (logged) when it does not apply.

    A trace broken on its own workload is reported once as a warning; a trace that merely does
    not fit a different module (an anchor-block match) is logged at debug level."""
    if record.check_trace() is not None:
        return None
    try:
        return record.as_schedule(mod)
    except RelaxTuneError as err:
        logger.debug("record of workload %s skipped for a query: %s", record.workload.shash, err)
        return None
