"""Tuning-record databases.

``JSONDatabase`` reads and writes MetaSchedule's on-disk layout (``database_workload.json``,
``database_tuning_record.json``), so logs move both ways between relax_tune and MetaSchedule.
``MemoryDatabase`` keeps records in memory; ``UnionDatabase`` and ``OrderedUnionDatabase``
combine databases for queries; ``ScheduleFnDatabase`` wraps a hand-written schedule function.
``with db:`` makes ``db`` the current database (``Database.current()``).
"""

from .base import Database
from .equality import MODULE_EQUALITIES, ModuleEquality
from .indexed import IndexedDatabase
from .json_database import TUNING_RECORD_FILE, WORKLOAD_FILE, JSONDatabase
from .memory import MemoryDatabase
from .records import BASELINE_TRACE, TuningRecord, Workload, candidate_key, is_baseline
from .schedule_fn import ScheduleFnDatabase
from .union import OrderedUnionDatabase, UnionDatabase

__all__ = [
    "BASELINE_TRACE",
    "Database",
    "IndexedDatabase",
    "JSONDatabase",
    "MODULE_EQUALITIES",
    "MemoryDatabase",
    "ModuleEquality",
    "OrderedUnionDatabase",
    "ScheduleFnDatabase",
    "TUNING_RECORD_FILE",
    "TuningRecord",
    "UnionDatabase",
    "WORKLOAD_FILE",
    "Workload",
    "candidate_key",
    "is_baseline",
]
