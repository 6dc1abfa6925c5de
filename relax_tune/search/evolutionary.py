"""Evolutionary search: mutate good candidates, rank them with the cost model, measure the best.

Each ``next_candidates`` call:

1. samples ``fresh_per_call`` new candidates from the design space into the pool;
2. for ``generations`` rounds, picks parents among the best measured candidates (the
   task's database records included: warm start) and the best-predicted pool entries,
   mutates them (``mutators``) and replays the mutants (postprocessing and checks included;
   invalid ones are dropped), adding the new ones to the pool;
3. returns ``n`` candidates: the best-predicted pool entries, except an ``epsilon`` share
   drawn at random from the pool (exploration while the model is still wrong); the first
   batch starts with ``best_predicted``'s choice, then one of each tensorizing sketch
   (``sketch_leads``: a task's tuned best is never behind its predicted schedule).

Steps 1 and 2 end early after ``max_fail_streak`` invalid or duplicate samples (mutants) in
a row; step 1 sooner, after ``MIN_TIMED_POOL`` samples with nothing new, half of them repeats
(its chunks start at ``MIN_TIMED_POOL`` and grow with what they find): the space of an
elementwise function holds a few programs (docs/design/time-budget.md).

The first call for a task whose candidates the cost model already ranks (the pre-trained
model; or a model trained on other tasks) and that has no measured candidate yet grows a
larger pool: ``ranked_pool`` fresh samples and ``ranked_generations`` rounds of
``ranked_mutants`` mutants, and returns the best-predicted ones without random picks. Those
first candidates are all the measurements most tasks of a real model get, and a model
that ranks before the first trial is worth most when it screens many candidates.

That pool is mostly fresh samples (512, one round of 64 mutants): mutation rounds take the
model's preferences to their extreme, where on a CPU it was not trained on it is most wrong
(the register tiles it learnt on another); fresh samples replay slower than mutants.

With ``small_pool_share`` above 0 (default 0: off), that share of the first batch is the
best-predicted of a small pool grown first (``SMALL_POOL``), a hedge against the model's
errors at the extremes of a large pool. The measurements: docs/design/first-pool.md.

With a transfer source (``SearchContext.transfer``), the first pool also gets the best
schedules of the task's closest alike workloads, refitted to its shapes; they lead the first
batch, become parents once measured, and may be ``best_predicted``'s answer (``sketch_leads``).

Steps 1 and 2 run early, in ``prepare``, when the tuner calls it while the previous batch
builds; the call then only re-scores the pool with the model that has learnt that batch,
and selects. Their replays go in chunks to a ``Replayer`` (``replayer.py``), which shares
them with the builder's idle, started workers (``SearchContext.replay_pool``); the
candidates are the same either way.

Nothing already measured, excluded or returned before is ever returned, and no two returned
candidates lower to the same program. Without a cost model, scores are random.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import tvm
from tvm.s_tir import Schedule, Trace

from ..cost_model.features import N_FEATURES, extract_features
from ..database.records import candidate_key, is_baseline
from ..space import sketch_part, space_for_target, without_decisions
from ..space.params import target_params
from ..utils import FAILED_RUN_SECS, schedule_from_json, structural_hash
from .base import Candidate, SearchContext, SearchStrategy
from .mutators import Mutator, default_mutators
from .pool_budget import MIN_TIMED_POOL, PoolBudget
from .replayer import Job, Outcome, Replayer, decisions_of, with_decisions
from .sketch_leads import applies_unmeasured, first_batch_order, put_first, replay_transferred

logger = logging.getLogger("relax_tune.search")

_SEED_HIGH = 2**31 - 1

@dataclass
class _Entry:
    """A valid, unmeasured candidate in the pool, with its features, and its sketch (an
    index into the replayer's) and decisions to mutate it from."""

    cand: Candidate
    program: int
    features: np.ndarray
    sketch: int
    decisions: list
    score: float = 0.0


@dataclass
class _Parent:
    """A measured candidate that mutations may start from: its sketch (an index) and the
    sketch with its decisions."""

    sketch: int
    trace: Trace
    secs: float


class EvolutionarySearch(SearchStrategy):
    """Cost-model-guided evolutionary search (see the module docstring).

    Args:
        mod: the normalised single-function workload.
        target: the target the candidates are for.
        seed: seed of the search's random generator (candidates are reproducible for a given
            model state).
        context: the shared cost model (None: random scores) and the task's records.
        population_size: parents drawn from per generation (best measured + best predicted).
        fresh_per_call: fresh design-space samples added to the pool per call.
        generations: mutation rounds per call.
        mutants_per_generation: mutation attempts per round.
            (These three default to the class's ``FRESH_PER_CALL``, ``GENERATIONS``,
            ``MUTANTS_PER_GENERATION``.)
        epsilon: share of each batch picked at random from the pool instead of by score.
        init_measured: best measured records (database included) kept as parents.
        warm_start_records: records of the task replayed at start to seed parents and to
            teach the cost model (best first; failures are only taught).
        max_pool: pool entries kept between calls (the best-predicted ones).
        max_fail_streak: consecutive invalid or duplicate samples (or mutants) that end the
            sampling (or the mutation rounds) of a call: a task whose space holds a few
            programs (an elementwise function) would otherwise replay them hundreds of times.
        ranked_pool, ranked_generations, ranked_mutants: fresh samples, mutation rounds and
            mutants per round of the first pool when the model already ranks the task
            (default: the class's ``RANKED_POOL``, ``RANKED_GENERATIONS``,
            ``RANKED_MUTANTS``).
        small_pool, small_pool_share: fresh samples, mutation rounds and mutants per round of
            the small pool grown first within that first pool, and the share of the first
            batch taken from its best-predicted (default: the class's ``SMALL_POOL``,
            ``SMALL_POOL_SHARE``).
        mutators: mutator -> probability; default ``default_mutators(num_cores)``.
        sketches: the design space; default ``space.generate_design_space(mod)``.
    """

    name = "evolutionary"
    FRESH_PER_CALL = 24
    GENERATIONS = 2
    MUTANTS_PER_GENERATION = 24
    RANKED_POOL = 512
    RANKED_GENERATIONS = 1
    RANKED_MUTANTS = 64
    SMALL_POOL = (64, 2, 32)  # fresh samples, rounds, mutants per round of the small pool
    SMALL_POOL_SHARE = 0.0  # of the first ranked batch, taken from the small pool (off)

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target, seed: int = 1,
                 context: SearchContext | None = None, population_size: int = 32,
                 fresh_per_call: int | None = None, generations: int | None = None,
                 mutants_per_generation: int | None = None, epsilon: float = 0.1,
                 init_measured: int = 16, warm_start_records: int = 64, max_pool: int = 512,
                 max_fail_streak: int = 64, ranked_pool: int | None = None,
                 ranked_generations: int | None = None, ranked_mutants: int | None = None,
                 small_pool: tuple[int, int, int] | None = None,
                 small_pool_share: float | None = None,
                 mutators: dict[Mutator, float] | None = None,
                 sketches: list[Trace] | None = None) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], not {epsilon}")
        if max_fail_streak < 1:
            raise ValueError(f"max_fail_streak must be at least 1, not {max_fail_streak}")
        self.mod = mod
        self.target = target
        self.context = context or SearchContext()
        self.model = self.context.cost_model
        # The cost model's data is keyed by the workload, not the task name: names such as
        # "main" or "matmul1" collide between models that share a work_dir.
        self.task = str(structural_hash(mod))
        self.space = space_for_target(target)
        set_target = getattr(self.model, "set_target", None)
        if set_target is not None:  # models that use machine facts (the pre-trained one)
            set_target(self.task, target)
        if sketches is None:
            sketches = self.space.generate_design_space(mod)
        self.replayer = Replayer(mod, target, self.space, pool=self.context.replay_pool)
        self.sketches = [without_decisions(s) for s in sketches] or [Trace([], {})]
        self._sketch_ids = [self.replayer.sketch_index(s) for s in self.sketches]
        self.rng = np.random.default_rng(seed)
        self.population_size = population_size
        self.fresh_per_call = self.FRESH_PER_CALL if fresh_per_call is None else fresh_per_call
        self.generations = self.GENERATIONS if generations is None else generations
        self.mutants_per_generation = \
            self.MUTANTS_PER_GENERATION if mutants_per_generation is None \
            else mutants_per_generation
        self.epsilon = epsilon
        self.init_measured = init_measured
        self.max_pool = max_pool
        self.max_fail_streak = max_fail_streak
        self.ranked_pool = self.RANKED_POOL if ranked_pool is None else ranked_pool
        self.ranked_generations = \
            self.RANKED_GENERATIONS if ranked_generations is None else ranked_generations
        self.ranked_mutants = self.RANKED_MUTANTS if ranked_mutants is None else ranked_mutants
        self.small_pool = tuple(self.SMALL_POOL if small_pool is None else small_pool)
        self.small_pool_share = \
            self.SMALL_POOL_SHARE if small_pool_share is None else small_pool_share
        if not 0.0 <= self.small_pool_share <= 1.0:
            raise ValueError(f"small_pool_share must be in [0, 1], not {small_pool_share}")
        muts = mutators or default_mutators(target_params(target).num_cores)
        self.mutators = list(muts)
        probs = np.asarray([max(0.0, float(p)) for p in muts.values()])
        self.mutator_probs = probs / probs.sum() if probs.sum() > 0 else None
        self._tunable = any(s.insts for s in self.sketches) and any(
            inst.kind.name.startswith("Sample") for s in self.sketches for inst in s.insts)
        self._pool: dict[str, _Entry] = {}
        self._returned: set[str] = set()
        self._programs: set[int] = set()
        self._parents: dict[str, _Parent] = {}
        self._given: dict[str, np.ndarray] = {}  # features of returned candidates
        self._prepared = False  # the next call's pool was grown by prepare() already
        self._grown = False  # a pool was grown before (the next one is not the first)
        self._ranked_first = False  # the pool is the larger first one the model ranks
        self._small_pool: set[str] = set()  # keys of the first ranked pool's small part
        self._budget = PoolBudget()  # of the pool being grown
        self._transferred: list[tuple[str, bool]] = []  # (key, close enough to apply unmeasured)
        self._transfer_tried = False
        self._predicted_key: str | None = None  # best_predicted's choice: leads batch one
        self._lead_trace: list | None = None  # ``lead_with``'s, until the first batch
        self._repeats = 0  # samples dropped as repeats of a pooled or returned program
        self.errors: dict[str, int] = {}
        """Why samples and mutants were dropped: reason -> count."""
        self.stats = {"replays": 0, "replay_secs": 0.0, "feature_secs": 0.0,
                      "predict_secs": 0.0, "mutants": 0, "fresh": 0}
        """Work done so far (for reports and the benchmark)."""
        self._warm_start(self.context.records[:warm_start_records])

    # -- warm start -----------------------------------------------------------------------

    def _warm_start(self, records: list) -> None:
        """Replay the task's best records: they become parents, and the model learns them."""
        rows, secs, keys = [], [], []
        for rec in records:
            trace_json = getattr(rec, "trace_json", None)
            if is_baseline(trace_json):
                continue  # the untuned baseline: nothing to mutate
            key = candidate_key(trace_json)
            self._returned.add(key)
            try:
                sch = schedule_from_json(self.mod, trace_json)
            except Exception as err:  # a record from another version of the space
                logger.debug("warm start: record not replayable: %s", err)
                continue
            run = float(rec.mean_run_secs) if rec.is_valid else FAILED_RUN_SECS
            self._programs.add(structural_hash(sch.mod))
            if rec.is_valid and len(self._parents) < self.init_measured:
                self._parents[key] = self._parent_of(sch, run)
            rows.append(self._features(sch))
            secs.append(run)
            keys.append(key)
        if self.model is not None and rows:
            self.model.update_features(self.task, np.stack(rows), secs, keys)

    # -- pieces ---------------------------------------------------------------------------

    def _note(self, reason: str) -> None:
        key = reason.split(":")[0][:80]
        self.errors[key] = self.errors.get(key, 0) + 1

    def _features(self, sch: Schedule) -> np.ndarray:
        start = time.perf_counter()
        out = extract_features(sch)
        self.stats["feature_secs"] += time.perf_counter() - start
        return out

    def _seed(self) -> int:
        return int(self.rng.integers(1, _SEED_HIGH))

    def _parent_of(self, sch: Schedule, secs: float) -> _Parent:
        """A parent from a schedule replayed here (a record, a candidate from elsewhere),
        on the replayer's copy of its sketch (its mutants then need no new sketch)."""
        sketch = sketch_part(sch.trace)
        index = self.replayer.sketch_index(without_decisions(sketch))
        return _Parent(index, with_decisions(self.replayer.sketches[index],
                                             decisions_of(sketch)), secs)

    def _replay(self, jobs: list[Job]) -> list[Outcome]:
        start = time.perf_counter()
        out = self.replayer.replay(jobs)
        self._budget.spend(len(jobs))
        self.stats["replays"] += len(jobs)
        self.stats["replay_secs"] += time.perf_counter() - start
        return out

    def _add(self, job: Job, out: Outcome, exclude: set[str] | frozenset[str]) -> bool:
        """Pool the outcome of ``job`` if it is valid and new."""
        if not out.ok:
            self._note(out.error or "invalid")
            return False
        key = out.key
        if key in self._pool or key in self._returned or key in exclude:
            self._note("duplicate")
            self._repeats += 1
            return False
        if out.program in self._programs or \
                any(e.program == out.program for e in self._pool.values()):
            self._note("duplicate program")
            self._repeats += 1
            return False
        cand = Candidate(sch=out.sch, trace_json=out.trace_json, key=key, mod=self.mod)
        self._pool[key] = _Entry(cand, out.program, out.features, job.sketch, out.decisions)
        return True

    def _sample_fresh(self, count: int, exclude: set[str] | frozenset[str]) -> int:
        added, attempts, streak = 0, 0, 0
        repeats = 0  # among the replays since the last new program (``streak``)
        cap = 4 * count + 8
        while added < count and attempts < cap and streak < self.max_fail_streak \
                and not (added >= MIN_TIMED_POOL and self._budget.spent()):
            if streak >= MIN_TIMED_POOL and 2 * repeats >= streak:
                break  # nothing new for a while, half of it repeats: a space of few programs
            # never more jobs than candidates still wanted (every job replayed here past the
            # count is wasted); small chunks first: a space of few programs shows at once
            size = self._chunk(min(cap - attempts, count - added, MIN_TIMED_POOL + 2 * added),
                               MIN_TIMED_POOL - added)
            jobs = [Job(self._sketch_ids[int(self.rng.integers(len(self._sketch_ids)))], [],
                        self._seed()) for _ in range(size)]
            for job, out in zip(jobs, self._replay(jobs)):
                attempts += 1
                before = self._repeats
                if self._add(job, out, exclude):
                    added += 1
                    streak = repeats = 0
                else:
                    streak += 1
                    repeats += self._repeats - before
                if added >= count or streak >= self.max_fail_streak:
                    break
        self.stats["fresh"] += added
        return added

    def _score_pool(self) -> None:
        if not self._pool:
            return
        entries = list(self._pool.values())
        start = time.perf_counter()
        if self.model is None:
            scores = self.rng.random(len(entries))
        else:
            scores = self.model.predict_features(self.task, np.stack([e.features for e in entries]))
        self.stats["predict_secs"] += time.perf_counter() - start
        for entry, score in zip(entries, scores):
            entry.score = float(score)

    def _parent_traces(self) -> list[tuple[int, Trace]]:
        """(sketch index, sketch with decisions) of the generation's parents."""
        measured = sorted(self._parents.values(), key=lambda p: p.secs)[:self.init_measured]
        k = max(1, self.population_size - len(measured))
        predicted = sorted(self._pool.values(), key=lambda e: -e.score)[:k]
        return [(p.sketch, p.trace) for p in measured] + [
            (e.sketch, with_decisions(self.replayer.sketches[e.sketch], e.decisions))
            for e in predicted]

    def _mutant_job(self, sketch: int, child: Trace) -> Job:
        known = self.replayer.sketches[sketch].insts
        if len(child.insts) != len(known) or \
                not all(a.same_as(b) for a, b in zip(child.insts, known)):
            # the mutator changed an instruction (a literal parallel budget): a new sketch
            sketch = self.replayer.sketch_index(without_decisions(child))
        return Job(sketch, decisions_of(child), self._seed())

    def _mutate(self, parent: Trace) -> Trace | None:
        order = self.rng.permutation(len(self.mutators)) if self.mutator_probs is None else \
            self.rng.choice(len(self.mutators), size=len(self.mutators), replace=False,
                            p=self.mutator_probs)
        for i in order:  # the chosen mutator first, the others when it has nothing to change
            child = self.mutators[int(i)].apply(parent, self.rng)
            if child is not None:
                return child
        return None

    def _evolve(self, exclude: set[str] | frozenset[str], generations: int,
                mutants: int) -> None:
        streak = 0
        for _ in range(generations):
            if self._budget.spent():
                return
            self._score_pool()
            parents = self._parent_traces()
            if not parents:
                return
            done = 0
            while done < mutants and not (done and self._budget.spent()):
                jobs: list[Job | None] = []
                for _ in range(self._chunk(mutants - done, 1)):
                    sketch, trace = parents[int(self.rng.integers(len(parents)))]
                    child = self._mutate(trace)
                    jobs.append(None if child is None else self._mutant_job(sketch, child))
                outs = iter(self._replay([j for j in jobs if j is not None]))
                for job in jobs:
                    done += 1
                    if job is None:
                        self._note("no mutation applies")
                        streak += 1
                    elif self._add(job, next(outs), exclude):
                        self.stats["mutants"] += 1
                        streak = 0
                    else:
                        streak += 1
                    if streak >= self.max_fail_streak:
                        return

    # -- the strategy ---------------------------------------------------------------------

    def next_candidates(self, n: int, exclude: set[str] | frozenset[str] = frozenset()
                        ) -> list[Candidate]:
        """Up to ``n`` new candidates (see the module docstring); fewer, possibly none, when
        the space runs dry."""
        if n <= 0:
            return []
        for key in [k for k in self._pool if k in exclude]:
            del self._pool[key]
        if not self._tunable:
            return self._untunable(n, exclude)
        if not self._prepared:
            self._grow(exclude, at_least=n - len(self._pool))
        self._prepared = False
        self._add_lead(exclude)
        if len(self._pool) < n:
            self._sample_fresh(n - len(self._pool), exclude)
        self._score_pool()
        out = self._select(n, 0.0 if self._ranked_first else self.epsilon)
        self._ranked_first = False
        for cand in out:
            self._returned.add(cand.key)
            entry = self._pool.pop(cand.key)
            self._given[cand.key] = entry
            self._programs.add(entry.program)
        self._trim_pool()
        logger.debug("evolutionary search %s: %d candidates, pool %d, %s", self.task, len(out),
                     len(self._pool), self.errors)
        return out

    def lead_with(self, trace_json: list) -> None:
        """Lead the first batch with ``trace_json``'s candidate (chosen unmeasured in another
        process, ``tuning.predict_pool``), replayed into the pool where the pool lacks it."""
        self._predicted_key = candidate_key(trace_json)
        self._lead_trace = trace_json

    def _add_lead(self, exclude: set[str] | frozenset[str]) -> None:
        trace_json, self._lead_trace = self._lead_trace, None
        if trace_json is None or self._given or self._predicted_key in self._pool:
            return
        try:
            job = self._job_of(schedule_from_json(self.mod, trace_json).trace)
        except Exception as err:  # noqa: BLE001 - the pool's own lead it is, then
            logger.debug("the lead of %s does not replay here: %s", self.task, err)
            return
        self._add(job, self._replay([job])[0], exclude)

    def best_predicted(self, exclude: set[str] | frozenset[str] = frozenset(),
                       accept=None, lookahead: int = 64, fits=None) -> Candidate | None:
        """The schedule to apply unmeasured, left in the pool (the next call may return it):
        the closest transferred one that applies unmeasured
        (``sketch_leads.applies_unmeasured``) and passes ``fits``, else the model's first
        (the pool grown first, as ``prepare``), or the first of its ``lookahead`` best that
        passes ``accept`` (a check, or checks by preference) where one does. None if neither."""
        ranks = getattr(self.model, "ranks", None)
        model_ranks = ranks is not None and ranks(self.task)
        if not self._tunable or not (model_ranks or self.context.transfer is not None):
            return None  # without a model that ranks the task, its first choice is chance
        self._add_transferred(exclude)  # the pool is not grown where one applies
        transferred = [e for e in self._transferred_entries(applicable_only=True)
                       if e.cand.key not in exclude and (fits is None or fits(e.cand))]
        if transferred:
            self._predicted_key = transferred[0].cand.key
            return transferred[0].cand
        if not model_ranks:
            return None
        self.prepare(exclude)
        self._score_pool()
        # a transferred schedule not applicable is left to measurement (the model has not
        # seen its like), unless the pool holds nothing else: sampling gives no other program.
        unfit = {e.cand.key for e in self._transferred_entries()}
        entries = [e for e in self._pool.values() if e.cand.key not in exclude]
        entries = [e for e in entries if e.cand.key not in unfit] or entries
        ranked = [e.cand for e in sorted(entries, key=lambda e: -e.score)]
        checks = [accept] if callable(accept) else list(accept or ())
        best = next((c for f in checks for c in ranked[:lookahead] if f(c)), (ranked or [None])[0])
        self._predicted_key = best.key if best is not None else None
        return best

    def prepare(self, exclude: set[str] | frozenset[str] = frozenset()) -> None:
        """Grow the pool for the next call now: fresh samples and the mutation rounds, from
        the parents and the model as they are before the batch under way is measured. The
        tuner calls this while the builders compile that batch, so the search overlaps the
        builds; the next call then only re-scores the pool with the updated model and
        selects (the batch's results become parents one call later)."""
        if self._tunable and not self._prepared:
            self._grow(exclude)
            self._prepared = True

    def _chunk(self, wanted: int, floor: int) -> int:
        return self._budget.chunk(wanted, floor, self.stats["replays"], self.stats["replay_secs"])

    def _grow(self, exclude: set[str] | frozenset[str], at_least: int = 0) -> None:
        """Fresh samples and mutation rounds for the next call (the first pool larger when the
        model ranks the task). With a budget per pool (``SearchContext.pool_secs``; the first
        ``pool_replays`` too) growing stops when it is spent, after ``MIN_TIMED_POOL`` samples."""
        self._budget.start(self.context.pool_secs, None if self._grown else
                           self.context.pool_replays)
        try:
            self._grow_pool(exclude, at_least)
        finally:
            self._budget.stop()

    def _grow_pool(self, exclude: set[str] | frozenset[str], at_least: int) -> None:
        fresh, generations, mutants = \
            self.fresh_per_call, self.generations, self.mutants_per_generation
        ranks = getattr(self.model, "ranks", None)
        if not self._grown and not self._parents and ranks is not None and ranks(self.task):
            fresh, generations, mutants = \
                self.ranked_pool, self.ranked_generations, self.ranked_mutants
            self._ranked_first = True
        self._add_transferred(exclude)
        self._grown = True
        if self._ranked_first and self.small_pool_share > 0:
            small_fresh, small_generations, small_mutants = self.small_pool
            fresh -= self._sample_fresh(min(small_fresh, fresh), exclude)
            self._evolve(exclude, small_generations, small_mutants)
            self._small_pool = set(self._pool)
        self._sample_fresh(max(fresh, at_least), exclude)
        self._evolve(exclude, generations, mutants)

    def _add_transferred(self, exclude: set[str] | frozenset[str]) -> None:
        """Pool the schedules of alike workloads (``SearchContext.transfer``), closest
        first; they lead the first batch and the no-measurement choice."""
        source = self.context.transfer
        if source is None or self._transfer_tried:
            return
        self._transfer_tried = True
        try:
            found = source.find(self.mod, self.target)
        except Exception as err:  # noqa: BLE001 - a transfer is a bonus, never a failure
            logger.debug("transfer for %s failed: %s", self.task, err)
            return
        for item, (job, out) in zip(found, replay_transferred(found, self._job_of,
                                                              self._replay)):
            if self._add(job, out, exclude):
                self._transferred.append((out.key, applies_unmeasured(item)))

    def _job_of(self, trace: Trace) -> Job:
        return Job(self.replayer.sketch_index(without_decisions(trace)), decisions_of(trace),
                   self._seed())

    def _transferred_entries(self, applicable_only: bool = False) -> list[_Entry]:
        return [self._pool[key] for key, close in self._transferred
                if key in self._pool and (close or not applicable_only)]

    def _select(self, n: int, epsilon: float) -> list[Candidate]:
        ranked = sorted(self._pool.values(), key=lambda e: -e.score)
        if self._transferred:  # transferred schedules lead the first batch
            ranked = put_first(self._transferred_entries()[:n], ranked)
        if self._ranked_first and self._small_pool:  # its best first (module docstring)
            small = [e for e in ranked if e.cand.key in self._small_pool]
            ranked = put_first(small[:int(round(self.small_pool_share * n))], ranked)
        if not self._given:  # the first batch: the predicted and tensorizing ones lead
            ranked = first_batch_order(ranked, self.replayer.sketches, n, self._predicted_key)
        n_random = min(len(ranked), int(math.floor(epsilon * n + self.rng.random())))
        n_best = min(len(ranked), n - n_random)
        chosen = ranked[:n_best]
        rest = ranked[n_best:]
        if rest and n_random:
            picks = self.rng.choice(len(rest), size=min(n_random, len(rest)), replace=False)
            chosen += [rest[int(i)] for i in picks]
        return [e.cand for e in chosen]

    def _trim_pool(self) -> None:
        if len(self._pool) <= self.max_pool:
            return
        ranked = sorted(self._pool.items(), key=lambda kv: -kv[1].score)
        self._pool = dict(ranked[:self.max_pool])

    def _untunable(self, n: int, exclude: set[str] | frozenset[str]) -> list[Candidate]:
        """A space without sampling instructions holds one program per sketch."""
        out = []
        for sketch in self._sketch_ids:
            if len(out) >= n:
                break
            job = Job(sketch, [], self._seed())
            if self._add(job, self._replay([job])[0], exclude):
                key = list(self._pool)[-1]
                entry = self._pool.pop(key)
                self._returned.add(key)
                self._programs.add(entry.program)
                out.append(entry.cand)
        return out

    def update(self, candidates: list[Candidate], run_secs: list[float]) -> None:
        """Measured results: good ones become parents; the cost model learns all of them."""
        rows, keys = [], []
        for cand, secs in zip(candidates, run_secs):
            self._returned.add(cand.key)
            entry = self._given.pop(cand.key, None)
            if secs < FAILED_RUN_SECS * 0.5:
                self._parents[cand.key] = self._parent_of(cand.sch, float(secs)) \
                    if entry is None else _Parent(entry.sketch, with_decisions(
                        self.replayer.sketches[entry.sketch], entry.decisions), float(secs))
            rows.append(self._features(cand.sch) if entry is None else entry.features)
            keys.append(cand.key)
        if len(self._parents) > 4 * self.init_measured:
            best = sorted(self._parents.items(), key=lambda kv: kv[1].secs)[:self.init_measured]
            self._parents = dict(best)
        if self.model is not None and rows:
            self.model.update_features(self.task, np.stack(rows).reshape(-1, N_FEATURES),
                                       list(run_secs), keys)
