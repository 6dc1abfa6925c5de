"""The no-measurement choice on every core: whole tasks chosen in the builder's workers.

A no-measurement session chooses each task's schedule in turn (``predict.choose``): grow
the task's pool, rank it with the model, check the best. That is milliseconds per candidate
in one process. Handing single replays to the workers (``search.replayer``) did not pay
here: EfficientNet-B0's 58 choices took 24.0 s with the workers replaying beside this
process and 21.0 s without them (AMD EPYC Zen 4, 2 cores), each worker parsing every task's
function for a few replays. A whole task is a unit that pays for its parse:
``WorkerChoices`` hands the workers the tasks from the front of the list (the heaviest)
while this process chooses from the back, as the replayer shares its jobs, and a worker makes
the task's state as the session made it (``init_state`` with the same index, seed, shares,
database, cost model and transferred schedules), so a task gets the same schedule whichever
process chose it (the searches' pool sizes are this process's too). A measuring session
does the same before its first batch, while the workers have nothing to build; a task a
worker chose leads its first batch with that schedule (``EvolutionarySearch.lead_with``).

Only a session of plain parts goes to the workers: its work_dir's own database, a cost model
named (not an object), static tasks. Others choose here (``worker_session``).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..search import EvolutionarySearch
from ..utils import error_line
from .predict import choose, choose_here, replays_of

_SESSIONS: dict[tuple, tuple] = {}
"""In a worker: the session parts made from a work_dir (database, cost model, transfer
source), keyed by the work_dir and its database files' sizes and times, so a later session
on changed files reads them again."""


def worker_session(db: Any, work_dir: Any, cfg: Any, builder: Any) -> dict | None:
    """The plain description of a session a worker can rebuild to choose its predictions,
    or None when it has parts a worker cannot make (a database other than the work_dir's
    own, a cost model object) or its builder has no workers of ours (not a
    ``LocalBuilder``)."""
    from ..database.json_database import JSONDatabase
    from ..measure import LocalBuilder

    if work_dir is None or not isinstance(builder, LocalBuilder) \
            or not isinstance(db, JSONDatabase) or not isinstance(cfg.cost_model, str):
        return None
    if os.path.abspath(getattr(db, "path_workload", "")) != os.path.abspath(
            work_dir.workload_file):
        return None
    return {"work_dir": work_dir.path, "cost_model": cfg.cost_model,
            "strategy": cfg.strategy, "seed": cfg.seed, "transfer": bool(cfg.transfer),
            "pool_sizes": {name: getattr(EvolutionarySearch, name) for name in POOL_SIZES}}


POOL_SIZES = ("FRESH_PER_CALL", "GENERATIONS", "MUTANTS_PER_GENERATION", "RANKED_POOL",
              "RANKED_GENERATIONS", "RANKED_MUTANTS")
"""The evolutionary search's pool sizes (class attributes): a worker takes this process's."""


def _parts(session: dict) -> tuple:
    """(database, cost model, transfer source) of ``session`` in this worker, read once per
    state of the work_dir's files."""
    from ..cost_model import make_cost_model
    from ..transfer import TransferSource, library_database
    from ..work_dir import WorkDir

    wd = WorkDir.of(session["work_dir"])
    stamp = tuple((os.path.getsize(p), os.path.getmtime(p)) if os.path.exists(p) else None
                  for p in (wd.workload_file, wd.record_file))
    key = (session["work_dir"], session["cost_model"], session["transfer"], stamp)
    if key not in _SESSIONS:
        _SESSIONS.clear()
        db = wd.open_database()
        model = make_cost_model(session["cost_model"], wd)
        source = TransferSource([db, library_database()], own=db) if session["transfer"] \
            else None
        _SESSIONS[key] = (db, model, source)
    return _SESSIONS[key]


def choose_task(session: dict, task: dict) -> list:
    """In a worker: ``[trace JSON or None, replays, error or None]`` of one task (``task``:
    its function as TVMScript, target JSON, name, weight, index in the session, and its
    search's pool shares), chosen as ``predict.choose`` chooses in the session's process."""
    try:
        from ..measure._worker import cached_target, cached_workload, script_digest
        from .extract import Task
        from .state import init_state

        mod = cached_workload(script_digest(task["script"]), task["script"])
        target = cached_target(task["target"])
        db, model, source = _parts(session)
        for name, value in session["pool_sizes"].items():
            setattr(EvolutionarySearch, name, value)
        if not db.has_workload(mod):
            return [None, 0, "its workload is not in the work_dir's database"]
        state = init_state(task["index"], Task(task["name"], mod, target, task["weight"]), db,
                           session["strategy"], session["seed"], model, None,
                           task["pool_secs"], source, task["pool_replays"])
        return [choose(state), replays_of(state), None]
    except Exception as err:  # noqa: BLE001 - the session's process chooses it instead
        return [None, 0, error_line(err)]


def _task_spec(st: Any, index: int) -> dict:
    context = st.search.context
    return {"script": st.task.mod.script(), "target": str(st.task.target),
            "name": st.task.task_name, "weight": st.task.weight, "index": index,
            "pool_secs": context.pool_secs, "pool_replays": context.pool_replays}


class WorkerChoices:
    """A ``choices`` for ``predict.predict_schedules``: the tasks of its ``order`` in
    ``pool``'s workers from the front and in this process from the back, yielded as
    ``choose_here`` yields them; a task a worker could not choose is chosen here.
    ``states`` is the session's list (a task's index there seeds its search)."""

    def __init__(self, pool: Any, session: dict, states: list) -> None:
        self.pool, self.session = pool, session
        self.index = {id(st): i for i, st in enumerate(states)}
        self.in_workers = 0
        """Tasks the workers chose."""

    def __call__(self, order: list, deadline: float | None):
        remote = [st for st in order if st.task.symbolic is None]
        if self.pool is None or len(remote) < 2:
            yield from choose_here(order, deadline)
            return
        yield from choose_here([st for st in order if st.task.symbolic is not None], deadline)
        try:
            futures = [self.pool.submit(choose_task, self.session,
                                        _task_spec(st, self.index[id(st)])) for st in remote]
        except Exception:  # noqa: BLE001 - the pool shut down: all here
            yield from choose_here(remote, deadline)
            return
        taken = len(remote)
        for i in reversed(range(len(remote))):  # from the back, until a worker has started
            if deadline is not None and time.monotonic() >= deadline:
                break
            if not futures[i].cancel():
                break
            taken = i
            yield from choose_here([remote[i]], None)
        for k, (st, future) in enumerate(zip(remote[:taken], futures[:taken])):
            late = deadline is not None and time.monotonic() >= deadline
            if late:  # all at once: the workers would go on taking the queued ones
                for queued in futures[k:taken]:
                    queued.cancel()
            if future.cancelled():
                continue
            try:  # a choice still running at the deadline is dropped: the limit holds
                trace_json, replays, error = future.result(
                    None if deadline is None else max(0.0, deadline - time.monotonic()))
            except FutureTimeout:
                continue
            except Exception as err:  # noqa: BLE001 - a worker lost: chosen here
                trace_json, replays, error = None, 0, error_line(err)
            if error is None:
                self.in_workers += 1
                lead_with = getattr(st.search, "lead_with", None)
                if trace_json is not None and lead_with is not None:
                    lead_with(trace_json)  # a measuring session measures it first
                yield st, trace_json, replays, None
            elif not late:
                yield from choose_here([st], None)
