"""What a work_dir holds, for every entry point alike (passes, pipeline, scripts, CLI):

    work_dir/database_workload.json        the workloads (MetaSchedule's layout)
    work_dir/database_tuning_record.json   every measured candidate, one JSON line each
    work_dir/tasks.json                    task names, weights and function names by hash
                                           (and the sizes of dynamic-shape buckets)
    work_dir/cost_model/                   the cost model, warm-started by the next run
    work_dir/dispatch_ranking.json         (opt-in) dynamic-shape buckets' records ranked
                                           as dispatched (dispatch_rank.py)
    work_dir/dispatch_plan.json            which bucket serves which sizes, measured
                                           (dispatch_plan.py)
    work_dir/logs/tune.log                 the full tuning log

Tuning creates what is missing; applying records (``ApplyDatabase``, ``relax-tune
compile``) only reads, and never creates a work_dir.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from typing import Any

from .database import Database, JSONDatabase, MemoryDatabase
from .database.json_database import WORKLOAD_FILE
from .utils import RelaxTuneError

logger = logging.getLogger("relax_tune.work_dir")

TASK_META_FILE = "tasks.json"
"""Task names, weights and function names of the models tuned in a work_dir."""


def logs_dir(work_dir: str) -> str:
    """Where a work_dir keeps its tuning logs."""
    return os.path.join(work_dir, "logs")


def cost_model_dir(work_dir: str) -> str:
    """Where a work_dir keeps its saved cost model."""
    return os.path.join(work_dir, "cost_model")


def check_work_dir(work_dir: Any) -> str:
    """``work_dir`` as a path string; RelaxTuneError when it names a file or is no path."""
    if not isinstance(work_dir, (str, os.PathLike)) or not os.fspath(work_dir):
        raise RelaxTuneError(f"work_dir must be a directory path, not {work_dir!r}")
    path = os.fspath(work_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise RelaxTuneError(f"work_dir {path!r} is a file, not a directory: give a new or "
                             "existing directory for the tuning records")
    return path


def open_database(work_dir: str | None, database: Database | None) -> Database:
    """The database tuning writes to: the one given, the current ``with db:`` one, or
    work_dir's JSON files (created when missing)."""
    if database is not None:
        return database
    if work_dir is None:
        current = Database.current()
        if current is not None:
            return current
        raise RelaxTuneError("give work_dir=... (where tuning records are kept) or database=...")
    return JSONDatabase(work_dir=check_work_dir(work_dir))


def open_for_apply(work_dir: str) -> Database:
    """work_dir's database for reading records; an empty database (with a warning) when the
    directory holds none, so applying never creates files."""
    path = check_work_dir(work_dir)
    if not os.path.isfile(os.path.join(path, WORKLOAD_FILE)):
        logger.warning("%s holds no tuning database (%s missing): no function is replaced; "
                       "tune into it first (TuneIRMod, relax-tune tune)", path, WORKLOAD_FILE)
        return MemoryDatabase()
    return JSONDatabase(work_dir=path)


def write_task_meta(work_dir: str, tasks: Iterable[Any]) -> str:
    """Record the tasks' names, weights and function names in ``work_dir/tasks.json``
    (merged with what is there, keyed by structural hash) so reports can weight them;
    return the path."""
    path = os.path.join(work_dir, TASK_META_FILE)
    meta = read_task_meta(work_dir)
    for task in tasks:
        weight = float(task.weight)
        meta[int(task.shash)] = {"name": task.task_name,
                                 "weight": int(weight) if weight.is_integer() else weight,
                                 "func_names": list(task.func_names)}
        if getattr(task, "shape", None):  # a bucket of a symbolic function: ApplyDatabase
            meta[int(task.shash)]["shape"] = dict(task.shape)  # finds its size here
    os.makedirs(work_dir, exist_ok=True)
    write_json(work_dir, TASK_META_FILE, [{"shash": str(k), **v} for k, v in meta.items()])
    return path


def hinted_sizes(work_dir: str | None) -> dict[str, set[int]]:
    """``{var name: sizes}`` of the dynamic-shape buckets tuned into ``work_dir``."""
    out: dict[str, set[int]] = {}
    if work_dir is None or not os.path.isdir(work_dir):
        return out
    for item in read_task_meta(work_dir).values():
        for name, size in (item.get("shape") or {}).items():
            if isinstance(size, int) and size > 0:
                out.setdefault(str(name), set()).add(size)
    return out


def read_task_meta(work_dir: str) -> dict[int, dict]:
    """``{structural hash: {"name", "weight", ...}}`` from ``work_dir/tasks.json``, or {}."""
    path = os.path.join(work_dir, TASK_META_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            return {int(item["shash"]): {k: v for k, v in item.items() if k != "shash"}
                    for item in json.load(file)}
    except (OSError, ValueError, KeyError, TypeError) as err:
        logger.warning("%s is unreadable (%s); task names and weights unknown", path, err)
        return {}


def read_json_entries(work_dir: str | None, name: str, unreadable: str
                      ) -> dict[str, dict[str, Any]]:
    """The object entries of the JSON file ``name`` in ``work_dir`` (``{key: dict}``), or {}
    when there is none; an unreadable one is logged with what happens then
    (``unreadable``) and read as {}."""
    if work_dir is None:
        return {}
    path = os.path.join(work_dir, name)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
        return {str(k): v for k, v in data.items() if isinstance(v, dict)}
    except (OSError, ValueError, AttributeError) as err:
        logger.warning("%s is unreadable (%s); %s", path, err, unreadable)
        return {}


def write_json(work_dir: str, name: str, data: Any) -> None:
    """``data`` as the JSON file ``name`` in ``work_dir``, replacing it whole (never a
    half-written file)."""
    path = os.path.join(work_dir, name)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as file:
        json.dump(data, file, indent=1, sort_keys=True)
    os.replace(tmp, path)
