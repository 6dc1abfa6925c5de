"""The database interface: storage methods subclasses implement, and the queries built on them.

A subclass needs only MetaSchedule's database contract: ``has_workload``, ``commit_workload``,
``commit_tuning_record``, ``get_top_k(workload, top_k)``, ``get_all_tuning_records`` and
``__len__``. Everything else relax_tune calls on a database (the queries, ``get_records``,
``get_all_workloads``, ``dump_pruned``, a target-filtered ``get_top_k``: see ``top_k_records``)
is provided here on top of those six.

Queries (``query_tuning_record``, ``query_schedule``, ``query_ir_module``, ``query``) normalise
the function they are given with ``utils.normalize_mod``, so a PrimFunc taken from a Relax
module finds the records tuned for it; a database that does not know the normalised module is
also asked for the module exactly as given (what MetaSchedule asks). They only return records
made for a target compatible with the query's (``utils.target_compatible``; a record without a
target matches any), and they never raise because a stored trace fails to replay: that record is
skipped with a warning and the next best one is tried.
"""

from __future__ import annotations

import functools
import inspect
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


@functools.lru_cache(maxsize=64)
def _target_param(get_top_k: Any, bound: bool) -> str:
    """How a ``get_top_k`` function takes a target: ``"keyword"`` (a parameter named
    ``target``, as relax_tune's ``get_top_k(workload, top_k, target=None)``), ``"positional"``
    (a third positional parameter or ``*args``), or ``""`` (MetaSchedule's
    ``get_top_k(workload, top_k)``). ``bound``: the function is a method's, ``self`` first."""
    try:
        params = list(inspect.signature(get_top_k).parameters.values())
    except (TypeError, ValueError):
        return ""
    positional = 0
    for param in params:
        if param.name == "target" and param.kind is not inspect.Parameter.VAR_KEYWORD:
            return "keyword"
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            return "positional"
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY,
                          inspect.Parameter.POSITIONAL_OR_KEYWORD):
            positional += 1
    return "positional" if positional >= (4 if bound else 3) else ""


def top_k_records(db: Database, workload: Workload, top_k: int,
                  target: tvm.target.Target | dict | str | None = None) -> list[TuningRecord]:
    """``db.get_top_k(workload, top_k, target)`` for any database, including one written
    against MetaSchedule's ``get_top_k(workload, top_k)``: that one is asked for all of its
    records of ``workload`` when a target filter is needed, and its answer is re-ranked
    (failed records dropped, fastest first)."""
    method = db.get_top_k
    func = getattr(method, "__func__", None)
    how = _target_param(method if func is None else func, func is not None)
    if how == "keyword":
        return list(method(workload, top_k, target=target))
    if how == "positional":
        return list(method(workload, top_k, target))
    if target is None:
        return rank(method(workload, top_k))[:top_k]
    config = query_target_config(target)
    return rank(method(workload, max(len(db), top_k, 1)), config)[:top_k]


class Database:
    """Where tuning records live. Subclasses implement the storage methods of MetaSchedule's
    contract (``has_workload``, ``commit_workload``, ``commit_tuning_record``,
    ``get_top_k(workload, top_k)``, ``get_all_tuning_records``, ``__len__``), and may add a
    ``target`` argument to ``get_top_k`` and a faster ``get_records``; the queries,
    ``get_records``, ``get_all_workloads``, ``dump_pruned`` and the ``with db:`` scope are
    shared. relax_tune hands ``has_workload``/``commit_workload`` the modules it tunes and
    queries (normalised, see ``utils.normalize_mod``; on a miss, a query's module exactly as
    given) and never alters the modules a subclass stores.

    ``module_equality`` says when two workloads are the same: ``"structural"`` (default),
    ``"ignore-tensor"`` or ``"anchor-block"`` (see ``relax_tune.database.equality``).
    """

    # Defaults for subclasses that do not call ``Database.__init__``.
    module_equality: str = "structural"
    _equality: ModuleEquality = ModuleEquality("structural")

    def __init__(self, module_equality: str = "structural") -> None:
        self._equality = ModuleEquality(module_equality)
        self.module_equality = self._equality.name

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
        records made for a compatible target. A subclass may implement MetaSchedule's
        ``get_top_k(workload, top_k)`` instead: relax_tune then filters by target itself."""
        raise NotImplementedError(f"{type(self).__name__}.get_top_k")

    def get_records(self, workload: Workload) -> list[TuningRecord]:
        """Every record of ``workload``, failed ones included, in commit order (what a resumed
        tuner needs so as not to measure the same trace twice).

        This default picks them out of ``get_all_tuning_records()`` (the record's workload is
        ``workload`` itself or a module equal to it under ``module_equality``)."""
        equal: dict[int, bool] = {}  # id(record's Workload) -> same workload?
        out = []
        for record in self.get_all_tuning_records():
            key = id(record.workload)
            if key not in equal:
                other = record.workload
                equal[key] = other is workload or other.mod is workload.mod or \
                    self._equality.equal(other.mod, workload.mod)
            if equal[key]:
                out.append(record)
        return out

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
    def _find_workload(self, mod: tvm.IRModule, raw: tvm.IRModule | None = None,
                       ) -> tuple[Workload, tvm.IRModule] | None:
        """The stored workload equal to the normalised ``mod``, else the one equal to ``raw``
        (the module exactly as the query gave it, as MetaSchedule asks), with the module that
        matched it; or None."""
        if self.has_workload(mod):
            return self.commit_workload(mod), mod
        if raw is not None and raw is not mod and not tvm_ffi.structural_equal(raw, mod) \
                and self.has_workload(raw):
            return self.commit_workload(raw), raw
        return None

    def _candidates(self, mod: tvm.IRModule, target: dict | None, workload_name: str,
                    raw: tvm.IRModule | None = None,
                    ) -> tuple[tvm.IRModule, Iterator[TuningRecord]]:
        """Valid, target-compatible records for the normalised ``mod`` (else for ``raw``), best
        first, and the module their traces are to be replayed on (the one that matched)."""
        found = self._find_workload(mod, raw)
        if found is None:
            return mod, iter(())
        workload, matched = found
        return matched, iter(top_k_records(self, workload, max(len(self), 1), target))

    def _answer(self, mod: tvm.IRModule, target: dict | None, workload_name: str,
                replay: bool, raw: tvm.IRModule | None = None,
                ) -> tuple[TuningRecord, Schedule | None] | None:
        """This database's answer to a query of the normalised ``mod``: its best candidate whose
        trace replays (with ``replay``, replays on the matched module, and the schedule that
        gives), or None. The unions combine their members' answers."""
        matched, candidates = self._candidates(mod, target, workload_name, raw)
        for record in candidates:
            if replay:
                sch = replay_on(record, matched)
                if sch is not None:
                    return record, sch
            elif record.check_trace() is None:
                return record, None
        return None

    def _query(self, mod: tvm.IRModule | tirx.PrimFunc, target: Any, workload_name: str,
               replay: bool) -> tuple[TuningRecord, Schedule | None] | None:
        raw = mod if isinstance(mod, tvm.IRModule) else \
            tvm.IRModule({"main": mod}) if isinstance(mod, tirx.PrimFunc) else None
        return self._answer(normalize_mod(mod), query_target_config(target), workload_name,
                            replay, raw)

    def query_tuning_record(self, mod: tvm.IRModule | tirx.PrimFunc,
                            target: tvm.target.Target | dict | str | None = None,
                            workload_name: str = "main") -> TuningRecord | None:
        """The best valid record of ``mod`` for ``target`` whose trace replays, or None.

        ``target`` None means the ``with target:`` scope, or any target outside one."""
        answer = self._query(mod, target, workload_name, replay=False)
        return None if answer is None else answer[0]

    def query_schedule(self, mod: tvm.IRModule | tirx.PrimFunc,
                       target: tvm.target.Target | dict | str | None = None,
                       workload_name: str = "main") -> Schedule | None:
        """The best schedule of ``mod`` for ``target``: the best record's trace replayed on the
        query's (normalised) module, or None. Records whose trace does not replay are skipped.
        (A database that only knows ``mod`` exactly as given, not normalised, answers with its
        trace replayed on ``mod`` as given.)"""
        answer = self._query(mod, target, workload_name, replay=True)
        return None if answer is None else answer[1]

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
