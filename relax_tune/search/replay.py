"""Replay search: draw fresh decisions for a random sketch, keep what is valid and new."""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm.s_tir import Trace

from ..space import space_for_target, without_decisions
from ..utils import structural_hash, trace_to_json
from ..database.records import candidate_key
from .base import Candidate, SearchContext, SearchStrategy

logger = logging.getLogger("relax_tune.search")

_SEED_HIGH = 2**31 - 1


class ReplaySearch(SearchStrategy):
    """Random sampling of the design space (MetaSchedule's "replay trace").

    Each attempt picks a sketch at random, replays it with all decisions removed under a
    fresh 31-bit seed, validates the decisions and the schedule, and keeps the candidate if
    neither its key nor its program was seen before. Attempts are bounded: a call stops
    after ``max_fail_streak`` consecutive invalid or duplicate samples, or
    ``max_attempts_per_candidate * n`` attempts in all.

    Args:
        mod: the normalised single-function workload.
        target: the target the candidates are for.
        seed: seed of the search's own random generator (candidates are reproducible).
        sketches: the design space; default ``generate_design_space(mod, target)``.
        max_fail_streak: consecutive failed attempts that end a call.
        max_attempts_per_candidate: attempts per requested candidate that end a call.
        context: ignored (replay search learns nothing).
    """

    name = "replay"

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target, seed: int = 1,
                 sketches: list[Trace] | None = None, max_fail_streak: int = 64,
                 max_attempts_per_candidate: int = 16,
                 context: SearchContext | None = None) -> None:
        self.mod = mod
        self.target = target
        self.space = space_for_target(target)
        if sketches is None:
            sketches = self.space.generate_design_space(mod)
        self.sketches = [without_decisions(s) for s in sketches] or [Trace([], {})]
        self.rng = np.random.default_rng(seed)
        self.max_fail_streak = max_fail_streak
        self.max_attempts_per_candidate = max_attempts_per_candidate
        self._keys: set[str] = set()
        self._programs: set[int] = set()
        self._tries = [0] * len(self.sketches)
        self._wins = [0] * len(self.sketches)
        self._fixed_done = [False] * len(self.sketches)
        self._sizes = [_categorical_space_size(s) for s in self.sketches]
        self._seen_decisions: list[set] = [set() for _ in self.sketches]
        self.errors: dict[str, int] = {}
        """Why samples were dropped: reason -> count (for reports and debugging)."""

    # -- sampling -------------------------------------------------------------------------

    def _pick_sketch(self) -> int | None:
        alive = [i for i in range(len(self.sketches)) if self._alive(i)]
        if not alive:
            return None
        return int(alive[int(self.rng.integers(len(alive)))])

    def _alive(self, i: int) -> bool:
        if self._fixed_done[i]:
            return False
        # a sketch that never produced a valid candidate in many tries is given up
        return self._wins[i] > 0 or self._tries[i] < 2 * self.max_fail_streak

    def _record_decisions(self, idx: int, trace: Trace) -> None:
        """Remember the decisions drawn for sketch ``idx``; a sketch whose choices are all
        categorical is done once every combination was drawn."""
        size = self._sizes[idx]
        if size is None:
            return
        decisions = tuple(int(trace.get_decision(inst)) for inst in trace.insts
                          if inst.kind.name == "SampleCategorical")
        self._seen_decisions[idx].add(decisions)
        if len(self._seen_decisions[idx]) >= size:
            self._fixed_done[idx] = True

    def _note(self, reason: str) -> None:
        key = reason.split(":")[0][:80]
        self.errors[key] = self.errors.get(key, 0) + 1

    def next_candidates(self, n: int, exclude: set[str] | frozenset[str] = frozenset()
                        ) -> list[Candidate]:
        """Up to ``n`` new valid candidates: never one returned before or whose key is in
        ``exclude``; fewer (possibly none) when the space is exhausted or too many
        consecutive samples are invalid or duplicates."""
        out: list[Candidate] = []
        if n <= 0:
            return out
        streak = 0
        attempts = 0
        budget = self.max_attempts_per_candidate * n + self.max_fail_streak
        while len(out) < n and streak < self.max_fail_streak and attempts < budget:
            idx = self._pick_sketch()
            if idx is None:
                break
            attempts += 1
            self._tries[idx] += 1
            sketch = self.sketches[idx]
            seed = int(self.rng.integers(1, _SEED_HIGH))
            result = self.space.replay(self.mod, sketch, seed=seed)
            if not _has_sampling(sketch):
                self._fixed_done[idx] = True  # one program only: never sample it again
            if not result.ok:
                streak += 1
                self._note(result.error or "invalid")
                logger.debug("dropped a sample of sketch %d: %s", idx, result.error)
                continue
            sch = result.sch
            self._record_decisions(idx, sch.trace)
            trace_json = trace_to_json(sch.trace)
            key = candidate_key(trace_json)
            if key in self._keys or key in exclude:
                streak += 1
                self._keys.add(key)
                self._note("duplicate")
                continue
            program = structural_hash(sch.mod)
            self._keys.add(key)
            if program in self._programs:
                streak += 1
                self._note("duplicate program")
                continue
            self._programs.add(program)
            self._wins[idx] += 1
            streak = 0
            out.append(Candidate(sch=sch, trace_json=trace_json, key=key))
        logger.debug("replay search: %d/%d candidates in %d attempts", len(out), n, attempts)
        return out


def _categorical_space_size(trace: Trace) -> int | None:
    """How many decision combinations a sketch has when its only sampling instructions are
    categorical ones (None otherwise)."""
    size = 1
    for inst in trace.insts:
        name = inst.kind.name
        if name == "EnterPostproc":
            break
        if name == "SampleCategorical":
            size *= max(1, len(inst.attrs[0]))
        elif name.startswith("Sample"):
            return None
    return size


def _has_sampling(trace: Trace) -> bool:
    return any(inst.kind.name.startswith("Sample") for inst in trace.insts)
