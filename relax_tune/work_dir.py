"""What a work_dir holds, for every entry point alike (passes, pipeline, scripts, CLI):

    work_dir/database_workload.json        the workloads (MetaSchedule's layout)
    work_dir/database_tuning_record.json   every measured candidate, one JSON line each
    work_dir/predicted/                    schedules chosen without measurement, the cost
                                           model's first choice per task (run_secs null)
    work_dir/tasks.json                    task names, weights and function names by hash
                                           (and the sizes of dynamic-shape buckets)
    work_dir/cost_model/                   the cost model, warm-started by the next run
    work_dir/dispatch_ranking.json         (opt-in) dynamic-shape buckets' records ranked
                                           as dispatched (``relax_tune.dynamic.rank``)
    work_dir/dispatch_plan.json            which bucket serves which sizes, measured
                                           (``relax_tune.dynamic.plan``)
    work_dir/logs/tune.log                 the full tuning log
    work_dir/logs/timeline.jsonl           each batch's task state against tuning seconds

``WorkDir`` is the one value that knows these names and opens these files: an entry point
makes it once (``WorkDir.of``, which checks the path) and passes it on. Tuning creates what
is missing (``open_database``); applying records and reporting only read
(``open_for_apply``, ``open_existing``) and never create a work_dir.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .database import Database, JSONDatabase, MemoryDatabase
from .database.json_database import TUNING_RECORD_FILE, WORKLOAD_FILE
from .database.predicted import PredictedSchedules
from .utils import RelaxTuneError

logger = logging.getLogger(__name__)

TASK_META_FILE = "tasks.json"
"""Task names, weights and function names of the models tuned in a work_dir."""

RANKING_FILE = "dispatch_ranking.json"
"""Each ranked record of each dynamic-shape bucket and its time as dispatched."""

PREDICTED_DIR = "predicted"
"""The database of schedules chosen without measurement (``database.predicted``)."""

PLAN_FILE = "dispatch_plan.json"
"""Per dynamic-shape function, which bucket's kernel serves which sizes."""


@dataclass(frozen=True)
class WorkDir:
    """A tuning session's directory: every file name in it and the ways to open them."""

    path: str

    @classmethod
    def of(cls, work_dir: "WorkDir | str | os.PathLike") -> "WorkDir":
        """``work_dir`` as a ``WorkDir`` (passed through when it is one); RelaxTuneError when
        it is no path or names a file."""
        if isinstance(work_dir, WorkDir):
            return work_dir
        if not isinstance(work_dir, (str, os.PathLike)) or not os.fspath(work_dir):
            raise RelaxTuneError(f"work_dir must be a directory path, not {work_dir!r}")
        path = os.fspath(work_dir)
        if os.path.exists(path) and not os.path.isdir(path):
            raise RelaxTuneError(f"work_dir {path!r} is a file, not a directory: give a new or "
                                 "existing directory for the tuning records")
        return cls(path)

    @classmethod
    def maybe(cls, work_dir: "WorkDir | str | os.PathLike | None") -> "WorkDir | None":
        """``WorkDir.of(work_dir)``, or None for None."""
        return None if work_dir is None else cls.of(work_dir)

    def __str__(self) -> str:
        return self.path

    def __fspath__(self) -> str:
        return self.path

    def file(self, name: str) -> str:
        """The path of the file ``name`` in the work_dir."""
        return os.path.join(self.path, name)

    # ---------------------------------------------------------------- file names
    @property
    def workload_file(self) -> str:
        """The database's workloads (MetaSchedule's ``database_workload.json``)."""
        return self.file(WORKLOAD_FILE)

    @property
    def record_file(self) -> str:
        """The database's records (MetaSchedule's ``database_tuning_record.json``)."""
        return self.file(TUNING_RECORD_FILE)

    @property
    def logs_dir(self) -> str:
        """Where the tuning logs are kept."""
        return self.file("logs")

    @property
    def log_file(self) -> str:
        """The full tuning log."""
        return os.path.join(self.logs_dir, "tune.log")

    @property
    def timeline_file(self) -> str:
        """Each measured batch's task state against tuning seconds (``tuning.timeline``)."""
        return os.path.join(self.logs_dir, "timeline.jsonl")

    @property
    def cost_model_dir(self) -> str:
        """Where the saved cost model is kept."""
        return self.file("cost_model")

    @property
    def has_database(self) -> bool:
        """Whether the work_dir holds a tuning database."""
        return os.path.isfile(self.workload_file)

    def own_files(self) -> list[str]:
        """The files the work_dir keeps (database, predicted schedules, tasks.json, dispatch
        ranking and plan): no command may write its output over one of them."""
        predicted = [os.path.join(self.predicted_dir, name)
                     for name in (WORKLOAD_FILE, TUNING_RECORD_FILE)]
        return [self.workload_file, self.record_file, *predicted,
                *(self.file(name) for name in (TASK_META_FILE, RANKING_FILE, PLAN_FILE))]

    def check_writable(self) -> None:
        """RelaxTuneError when tuning could not write here: the folder or one of its database
        files is read-only (checked before any work, so nothing is measured for nothing)."""
        if os.path.isdir(self.path) and not os.access(self.path, os.W_OK | os.X_OK):
            raise RelaxTuneError(f"work_dir {self.path!r} is read-only: tune into a folder "
                                 "you can write to (copy this one there to resume it)")
        for path in (self.workload_file, self.record_file):
            if os.path.exists(path) and not os.access(path, os.W_OK):
                raise RelaxTuneError(f"database file {path!r} is read-only: make it writable "
                                     "or tune into another work_dir (copy this one there to "
                                     "resume it)")

    # ---------------------------------------------------------------- databases
    def open_database(self) -> JSONDatabase:
        """The database tuning writes to (created when missing)."""
        return JSONDatabase(work_dir=self.path)

    def open_for_apply(self) -> Database:
        """The database for reading records; an empty database (with a warning) when the
        directory holds none, so applying never creates files."""
        if not self.has_database:
            logger.warning("%s holds no tuning database (%s missing): no function is replaced; "
                           "tune into it first (TuneIRMod, relax-tune tune)", self.path,
                           WORKLOAD_FILE)
            return MemoryDatabase()
        return JSONDatabase(work_dir=self.path)

    def open_existing(self) -> JSONDatabase:
        """The database of a work_dir that must hold one (reports, the database tools);
        RelaxTuneError when it has none."""
        if not self.has_database:
            raise RelaxTuneError(f"{self.path!r} holds no tuning database ({WORKLOAD_FILE} "
                                 "missing): pass the --work-dir given to `relax-tune tune`")
        return JSONDatabase(work_dir=self.path)

    @property
    def predicted_dir(self) -> str:
        """Where the schedules chosen without measurement are kept
        (``database.predicted``)."""
        return self.file(PREDICTED_DIR)

    def open_predicted(self, create: bool = False) -> PredictedSchedules | None:
        """The work_dir's predicted schedules (created with ``create``; None when there are
        none and ``create`` is False)."""
        if not create and not os.path.isfile(os.path.join(self.predicted_dir, WORKLOAD_FILE)):
            return None
        return PredictedSchedules(JSONDatabase(work_dir=self.predicted_dir))

    # ---------------------------------------------------------------- tasks.json
    def write_task_meta(self, tasks: Iterable[Any]) -> str:
        """Record the tasks' names, weights and function names in ``tasks.json`` (merged
        with what is there, keyed by structural hash) so reports can weight them; return
        the path."""
        meta = self.read_task_meta()
        for task in tasks:
            weight = float(task.weight)
            meta[int(task.shash)] = {"name": task.task_name,
                                     "weight": int(weight) if weight.is_integer() else weight,
                                     "func_names": list(task.func_names)}
            if getattr(task, "shape", None):  # a bucket of a symbolic function: ApplyDatabase
                meta[int(task.shash)]["shape"] = dict(task.shape)  # finds its size here
        self.write_meta(meta)
        return self.file(TASK_META_FILE)

    def write_meta(self, meta: dict[int, dict]) -> None:
        """``meta`` (as ``read_task_meta`` returns it) as ``tasks.json``, replacing it."""
        os.makedirs(self.path, exist_ok=True)
        self.write_json(TASK_META_FILE, [{"shash": str(k), **v} for k, v in meta.items()])

    def read_task_meta(self) -> dict[int, dict]:
        """``{structural hash: {"name", "weight", ...}}`` from ``tasks.json``, or {}."""
        path = self.file(TASK_META_FILE)
        if not os.path.isfile(path):
            return {}
        try:
            with open(path, encoding="utf-8") as file:
                return {int(item["shash"]): {k: v for k, v in item.items() if k != "shash"}
                        for item in json.load(file)}
        except (OSError, ValueError, KeyError, TypeError) as err:
            logger.warning("%s is unreadable (%s); task names and weights unknown", path, err)
            return {}

    def hinted_sizes(self) -> dict[str, set[int]]:
        """``{var name: sizes}`` of the dynamic-shape buckets tuned into the work_dir."""
        out: dict[str, set[int]] = {}
        if not os.path.isdir(self.path):
            return out
        for item in self.read_task_meta().values():
            for name, size in (item.get("shape") or {}).items():
                if isinstance(size, int) and size > 0:
                    out.setdefault(str(name), set()).add(size)
        return out

    # ---------------------------------------------------------------- side files
    def read_entries(self, name: str, unreadable: str) -> dict[str, dict[str, Any]]:
        """The object entries of the JSON file ``name`` (``{key: dict}``), or {} when there
        is none; an unreadable one is logged with what happens then (``unreadable``) and
        read as {}."""
        path = self.file(name)
        if not os.path.isfile(path):
            return {}
        try:
            with open(path, encoding="utf-8") as file:
                data = json.load(file)
            return {str(k): v for k, v in data.items() if isinstance(v, dict)}
        except (OSError, ValueError, AttributeError) as err:
            logger.warning("%s is unreadable (%s); %s", path, err, unreadable)
            return {}

    def write_json(self, name: str, data: Any) -> None:
        """``data`` as the JSON file ``name``, replacing it whole (never a half-written
        file)."""
        path = self.file(name)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as file:
            json.dump(data, file, indent=1, sort_keys=True)
        os.replace(tmp, path)


def open_database(work_dir: WorkDir | None, database: Database | None) -> Database:
    """The database tuning writes to: the one given, the current ``with db:`` one, or
    work_dir's JSON files (created when missing)."""
    if database is not None:
        return database
    if work_dir is None:
        current = Database.current()
        if current is not None:
            return current
        raise RelaxTuneError("give work_dir=... (where tuning records are kept) or database=...")
    return work_dir.open_database()
