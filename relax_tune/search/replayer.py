"""Replaying candidates for a search, here and in the builder's idle worker processes.

A candidate of the evolutionary search is one of the design space's sketches with its
decisions (some missing: the replay samples them from a seed). Replaying it (apply the
sketch, postprocess, check), then writing its trace as JSON, hashing its program and
extracting its features costs milliseconds, and a task's first pool takes hundreds of them
while the builder has only the untuned function to compile. ``Replayer.replay`` hands
groups of such jobs to the builder's worker processes and works through the rest itself:
the workers take groups from the front of the queue, this process from the back, so it never
waits on a worker that is busy building (it replays everything itself then).

Only plain data crosses the process boundary (``measure/_worker.py``): the workload's
TVMScript text, the target's JSON, the jobs' sketches as trace JSON (a worker rebuilds each
once), per job the sketch's digest, its decisions as ``[[instruction index, value], ...]``
and the seed; back come the candidate's trace JSON, key, program hash, features and
decisions. Both sides run ``replay_job``, so a candidate is the same whichever process
replayed it (the search's candidates too: ``test_evolutionary``).
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm.s_tir import Schedule, Trace

from ..cost_model.features import extract_features
from ..measure._worker import cached_target, cached_workload, script_digest
from ..space import space_for_target, without_decisions
from ..utils import (apply_trace_json, error_line, replay_schedule, structural_hash, to_plain,
                     trace_to_json)
from ..database.records import candidate_key

logger = logging.getLogger("relax_tune.search")


@dataclass
class Job:
    """One replay: sketch ``sketch`` (an index) with ``decisions``; the rest sampled from
    ``seed``."""

    sketch: int
    decisions: list = field(default_factory=list)
    seed: int = 1


@dataclass
class Outcome:
    """A replayed job: the candidate, or why not (``error``)."""

    error: str | None = None
    trace_json: list | None = None
    key: str = ""
    program: int = 0
    features: np.ndarray | None = None
    decisions: list = field(default_factory=list)
    sch: Schedule | None = None  # when replayed in this process

    @property
    def ok(self) -> bool:
        """Whether the job gave a valid candidate."""
        return self.error is None


def decisions_of(trace: Trace) -> list:
    """The decisions of ``trace``'s sketch part as ``[[instruction index, plain value], ...]``."""
    out = []
    for i, inst in enumerate(trace.insts):
        if inst.kind.name == "EnterPostproc":
            break
        dec = trace.get_decision(inst)
        if dec is not None:
            out.append([i, to_plain(dec)])
    return out


def with_decisions(sketch: Trace, decisions: list) -> Trace:
    """``sketch`` (no decisions) with ``decisions`` from :func:`decisions_of`."""
    if not decisions:
        return sketch
    insts = list(sketch.insts)
    return Trace(insts, {insts[i]: value for i, value in decisions})


def replay_job(space: Any, mod: tvm.IRModule, sketch: Trace, decisions: list, seed: int,
               keep_schedule: bool = False) -> Outcome:
    """Replay one job (``space.replay``: decisions kept, the rest sampled, postprocessing
    and checks) and describe the candidate."""
    result = space.replay(mod, with_decisions(sketch, decisions), seed=seed)
    if not result.ok:
        return Outcome(error=result.error or "invalid")
    sch = result.sch
    trace_json = trace_to_json(sch.trace)
    return Outcome(trace_json=trace_json, key=candidate_key(trace_json),
                   program=structural_hash(sch.mod), features=extract_features(sch),
                   decisions=decisions_of(sch.trace), sch=sch if keep_schedule else None)


# --------------------------------------------------------------------------- worker side

_MAX_SKETCHES = 256
REBUILD_FAILED = "sketch does not rebuild in the worker"
_sketches: "OrderedDict[str, Trace]" = OrderedDict()
_spaces: dict[str, Any] = {}


def _worker_sketch(key: str, mod: tvm.IRModule, trace_json: list) -> Trace:
    sketch = _sketches.get(key)
    if sketch is None:
        # applying a sketch without decisions samples them; only the instructions are kept
        sch = replay_schedule(mod, seed=1)
        apply_trace_json(trace_json, sch)
        sketch = _sketches[key] = without_decisions(sch.trace)
        while len(_sketches) > _MAX_SKETCHES:
            _sketches.popitem(last=False)
    else:
        _sketches.move_to_end(key)
    return sketch


def replay_in_worker(digest: str, script: str, target_json: str, sketches: dict,
                     jobs: list) -> list:
    """Worker side of :meth:`Replayer.replay`: replay ``jobs`` (``[sketch digest, decisions,
    seed]``; ``sketches``: digest -> trace JSON text) of one workload. One row per job:
    ``[error]``, ``[None, trace_json, key, program, features, decisions]``, or
    ``[REBUILD_FAILED]`` when the sketch does not rebuild here (the parent replays it)."""
    mod = cached_workload(digest, script)
    target = cached_target(target_json)
    space = _spaces.get(target_json)
    if space is None:
        space = _spaces[target_json] = space_for_target(target)
    out = []
    for sketch_digest, decisions, seed in jobs:
        try:
            sketch = _worker_sketch(digest + sketch_digest, mod,
                                    json.loads(sketches[sketch_digest]))
        except Exception:  # noqa: BLE001 - the parent replays the job itself
            out.append([REBUILD_FAILED])
            continue
        try:
            res = replay_job(space, mod, sketch, decisions, seed)
        except Exception as err:  # noqa: BLE001 - the job fails, the others go on
            out.append([f"replay failed: {error_line(err, with_type=True)}"])
            continue
        if not res.ok:
            out.append([res.error])
        else:
            out.append([None, res.trace_json, res.key, str(res.program),
                        res.features.tolist(), res.decisions])
    return out


# --------------------------------------------------------------------------- parent side


class Replayer:
    """Replays jobs of one workload, in this process and in ``pool``'s idle workers.

    Args:
        mod: the workload.
        target: the target the candidates are for.
        space: the design space (``space_for_target(target)``).
        pool: a ``PopenPoolExecutor`` whose workers run ``measure/_worker.py``'s code (the
            ``LocalBuilder``'s ``replay_pool``), or None to replay everything here. A pool
            with a ``ready`` property gets jobs only while it is true.
        group: jobs per worker call (a call costs ~1 ms of transport).
    """

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target, space: Any,
                 pool: Any = None, group: int = 4) -> None:
        self.mod = mod
        self.target = target
        self.space = space
        self.pool = pool
        self.group = max(1, int(group))
        self.sketches: list[Trace] = []
        """The sketches jobs refer to (by index), without decisions."""
        self.stats = {"local": 0, "worker": 0}
        """Jobs replayed here and in the workers."""
        self._texts: list[str] = []
        self._digests: list[str] = []
        self._index: dict[str, int] = {}
        self._wire: tuple[str, str, str] | None = None  # digest, script, target JSON

    @property
    def parallel(self) -> bool:
        """Whether jobs may go to worker processes (else ``replay`` works them one by one
        here, and a caller gains nothing from batching them)."""
        return self.pool is not None

    def sketch_index(self, sketch: Trace) -> int:
        """The index of ``sketch`` (without decisions), added when it is new."""
        text = json.dumps(trace_to_json(sketch))
        index = self._index.get(text)
        if index is None:
            index = self._index[text] = len(self.sketches)
            self.sketches.append(sketch)
            self._texts.append(text)
            self._digests.append(script_digest(text)[:16])
        return index

    def replay(self, jobs: list[Job]) -> list[Outcome]:
        """One outcome per job, in order; the same whichever process replays a job."""
        if self.pool is None or len(jobs) <= self.group or not getattr(self.pool, "ready", True):
            return [self._local(job) for job in jobs]
        groups = [jobs[i:i + self.group] for i in range(0, len(jobs), self.group)]
        try:
            futures = [self._submit(g) for g in groups]
        except Exception as err:  # noqa: BLE001 - a pool shut down: replay here from now on
            logger.debug("replays stay in this process: %s", err)
            self.pool = None
            return [self._local(job) for job in jobs]
        results: list[list[Outcome] | None] = [None] * len(groups)
        for i in reversed(range(len(groups))):  # from the back, until a worker has started
            if not futures[i].cancel():
                break
            results[i] = [self._local(job) for job in groups[i]]
        for i, future in enumerate(futures):
            if results[i] is None:
                results[i] = self._collect(future, groups[i])
        return [out for group in results for out in group]  # type: ignore[union-attr]

    def _local(self, job: Job) -> Outcome:
        self.stats["local"] += 1
        return replay_job(self.space, self.mod, self.sketches[job.sketch], job.decisions,
                          job.seed, keep_schedule=True)

    def _submit(self, jobs: list[Job]) -> Future:
        if self._wire is None:
            script = self.mod.script()  # as the builder sends it: one parse per worker
            self._wire = (script_digest(script), script, str(self.target))
        digest, script, target_json = self._wire
        sketches = {self._digests[j.sketch]: self._texts[j.sketch] for j in jobs}
        return self.pool.submit(replay_in_worker, digest, script, target_json, sketches,
                                [[self._digests[j.sketch], j.decisions, j.seed] for j in jobs])

    def _collect(self, future: Future, jobs: list[Job]) -> list[Outcome]:
        try:
            rows = future.result()
        except (ChildProcessError, TimeoutError) as err:
            # what crashed or hung a worker is not replayed here (it could crash the
            # user's process); those jobs are dropped
            logger.debug("replays lost with a worker: %s", err)
            return [Outcome(error=f"replay crashed a worker: {type(err).__name__}")
                    for _ in jobs]
        except Exception as err:  # noqa: BLE001 - e.g. the package not importable there
            logger.debug("worker replays failed (%s); replaying here", err)
            return [self._local(job) for job in jobs]
        out = []
        for job, row in zip(jobs, rows):
            if row[0] == REBUILD_FAILED:
                out.append(self._local(job))
            elif row[0] is not None:
                out.append(Outcome(error=row[0]))
            else:
                self.stats["worker"] += 1
                _, trace_json, key, program, feats, decisions = row
                out.append(Outcome(trace_json=trace_json, key=key, program=int(program),
                                   features=np.asarray(feats, dtype=np.float32),
                                   decisions=decisions))
        return out
