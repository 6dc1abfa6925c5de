"""Read-only views over several databases: UnionDatabase (best record across all) and
OrderedUnionDatabase (the first database with a usable record wins).

As in MetaSchedule, a union asks each member for its own answer and combines the answers, so
unions nest: ``UnionDatabase(db3, OrderedUnionDatabase(db1, db2))`` answers with the better of
db3's record and the ordered union's (db1's when db1 has one, however fast db2's is). Queries
and ``get_top_k`` follow the same rule."""

from __future__ import annotations

import tvm
from tvm import tirx
from tvm.s_tir import Schedule

from ..utils import RelaxTuneError
from .base import Database, rank, top_k_records
from .records import TuningRecord, Workload


class _Combined(Database):
    """Shared parts of the union databases: reads combine the members, commits are refused."""

    def __init__(self, *databases: Database, module_equality: str = "structural") -> None:
        super().__init__(module_equality)
        for db in databases:
            if not isinstance(db, Database):
                raise RelaxTuneError(
                    f"{type(self).__name__} combines relax_tune databases, not "
                    f"{type(db).__module__}.{type(db).__name__}; open the files with "
                    "relax_tune.database.JSONDatabase")
        self.databases: list[Database] = list(databases)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(map(repr, self.databases))})"

    def has_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> bool:
        """True when any member holds the workload."""
        return any(db.has_workload(mod) for db in self.databases)

    def commit_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> Workload:
        """Refused: a union is a read-only view."""
        raise RelaxTuneError(f"{type(self).__name__} is read-only: commit to one of its members")

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Refused: a union is a read-only view."""
        raise RelaxTuneError(f"{type(self).__name__} is read-only: commit to one of its members")

    def get_records(self, workload: Workload) -> list[TuningRecord]:
        """The records of ``workload`` in every member, member by member."""
        return [rec for db in self.databases for rec in db.get_records(workload)]

    def get_all_workloads(self) -> list[Workload]:
        """Every member's workloads, member by member."""
        return [wl for db in self.databases for wl in db.get_all_workloads()]

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """Every member's records, member by member."""
        return [rec for db in self.databases for rec in db.get_all_tuning_records()]

    def __len__(self) -> int:
        """The total number of records in the members."""
        return sum(len(db) for db in self.databases)


class UnionDatabase(_Combined):
    """Asks every member for its answer and returns the fastest of those (ties: member order);
    a member that is itself a union answers as that union does."""

    def get_top_k(self, workload: Workload, top_k: int,
                  target: tvm.target.Target | dict | str | None = None) -> list[TuningRecord]:
        """The ``top_k`` fastest among the members' ``get_top_k`` answers for ``workload``."""
        if top_k < 0:
            raise RelaxTuneError(f"top_k must be non-negative, not {top_k}")
        merged = [rec for db in self.databases
                  for rec in top_k_records(db, workload, top_k, target)]
        return rank(merged)[:top_k]

    def _answer(self, mod: tvm.IRModule, target: dict | None, workload_name: str,
                replay: bool, raw: tvm.IRModule | None = None,
                ) -> tuple[TuningRecord, Schedule | None] | None:
        best = None
        for db in self.databases:
            answer = db._answer(mod, target, workload_name, replay, raw)
            if answer is not None and (best is None
                                       or answer[0].mean_run_secs < best[0].mean_run_secs):
                best = answer
        return best


class OrderedUnionDatabase(_Combined):
    """Queries the members in order; the first one with a usable record answers (a local
    database in front of a shared team database, say)."""

    def get_top_k(self, workload: Workload, top_k: int,
                  target: tvm.target.Target | dict | str | None = None) -> list[TuningRecord]:
        """``get_top_k`` of the first member that has valid records of ``workload``."""
        if top_k < 0:
            raise RelaxTuneError(f"top_k must be non-negative, not {top_k}")
        for db in self.databases:
            records = top_k_records(db, workload, top_k, target)
            if records:
                return records
        return []

    def _answer(self, mod: tvm.IRModule, target: dict | None, workload_name: str,
                replay: bool, raw: tvm.IRModule | None = None,
                ) -> tuple[TuningRecord, Schedule | None] | None:
        for db in self.databases:
            answer = db._answer(mod, target, workload_name, replay, raw)
            if answer is not None:
                return answer
        return None
