"""The measurement protocol of a tuning session, all of it: ``Measurer``.

The tuning loop (``relax_tune.tuning.loop``) hands ``Measurer.measure`` one batch of one task at a time
and commits what comes back; how a candidate gets its time is decided here, in this order:

1. Build the batch (the search prepares its next batch while the workers compile).
2. Time it, cutting losses on hopeless candidates: one whose warm-up call takes over
   ``_CUT_RATIO`` times the task's best (never under ``_MIN_CUT_SECS``, never over
   ``_BASELINE_MAX_SECS``) keeps that one call as its time.
3. The task's baseline -- the untuned function, or on a GPU the target's default schedule
   (``baseline.py``), measured once per task, with the task's first batch -- is built
   beside the batch's candidates; its first call gives the correctness check its reference
   outputs (so the untuned function is built once, not twice) and is its time when slow
   (over ``_BASELINE_ONE_CALL_SECS``); a fast one is timed in the candidates' interleaved
   rounds, first, so a spell of load on the machine falls on it and them alike.
4. Screen would-be bests for correctness (``verify.CorrectnessChecker``): a candidate about
   to become the task's best is run once more on seeded inputs and compared with the
   task's baseline; a wrong one becomes a failure and the next fastest is checked.
5. Re-time close would-be bests head-to-head (``head_to_head``): a candidate that would beat
   the best by less than ``_CLEAR_WIN`` is timed alternately with the task's reference
   kernel, on one device, and recorded in the reference's frame. At most ``_MAX_CHALLENGES``
   per batch.
6. What a record stores (``Measured.run_secs``): the candidate's times, or ``[1e10]``
   (``FAILED_RUN_SECS``) when it failed to build, run or check.
7. Keep the libraries later batches need (the task's best, the reference) and discard the
   rest of the batch.

The runner is used only through the interface ``Runner`` declares: ``run``,
``run_on_one_device`` (so a head-to-head stays on one device with a remote runner too), and
``time_and_fetch`` / ``run_and_fetch`` when the runner says it ``can_time_and_fetch`` /
``can_fetch``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..utils import FAILED_RUN_SECS
from .base import ERROR_CRASHED, ERROR_NOT_BUILT, ERROR_TIMEOUT, Builder, BuildResult, \
    MeasureError, Runner, RunResult
from .head_to_head import DEFAULT_ROUNDS, head_to_head
from .verify import CorrectnessChecker

if TYPE_CHECKING:
    from ..tuning.extract import Task

logger = logging.getLogger("relax_tune.measure.measurer")

_BASELINE_MAX_SECS = 1.0
"""A candidate slower than this per call is timed once, not repeatedly."""
_CUT_RATIO = 2
"""A candidate whose warm-up call takes over this many times the task's best (the untuned
time while no tuned one is known) is timed by that call only: it cannot become the best."""
_MIN_CUT_SECS = 1e-3
"""The cut never goes below this: short calls carry one-off costs (cold caches, page faults)."""
_BASELINE_ONE_CALL_SECS = 0.1
"""An untuned function slower than this per call is timed by one call (it is a baseline for
the speedup, not a candidate to rank); with the correctness check on, that call also gives
the check its reference outputs, so the untuned function runs once, not twice."""
_CLEAR_WIN = 1.5
"""A would-be best this many times faster than the best so far needs no head-to-head: the
machine's drift stays well inside it (docs/design/head-to-head.md)."""
_MAX_CHALLENGES = 4
"""Head-to-heads per batch at most (later would-be bests keep their own timing)."""


@dataclass
class Incumbent:
    """What the protocol keeps of one task between its batches (the tuner holds one per task
    and passes it to every ``measure``)."""

    trace: list | None = None
    """Trace of the task's best record (None: no valid tuned record yet)."""
    artifact: str | None = None
    """Its library, when built in this session (built on demand otherwise)."""
    reference: tuple[str, float] | None = None
    """(library, recorded secs) of the kernel that head-to-heads compare with: the best when
    the first one was needed, replaced only by a clear winner (see ``Measurer.challenge``)."""


@dataclass(frozen=True)
class Measured:
    """One candidate of a batch after the whole protocol: its build, its timing (screened and
    challenged) and what its database record stores."""

    trace: list | None
    """The candidate's trace; None for the task's baseline."""
    build: BuildResult
    run: RunResult

    @property
    def ok(self) -> bool:
        """True when the candidate was built, ran, passed the check and has times."""
        return bool(self.build.error is None and self.run.error is None and self.run.run_secs)

    @property
    def error(self) -> str | None:
        """Why the candidate failed (None when it did not)."""
        return self.build.error or self.run.error

    @property
    def run_secs(self) -> list[float]:
        """What the record stores: the candidate's times, or ``[FAILED_RUN_SECS]`` (1e10,
        what MetaSchedule writes) for a failed candidate."""
        return [float(x) for x in self.run.run_secs] if self.ok else [FAILED_RUN_SECS]  # type: ignore[union-attr]

    @property
    def mean_secs(self) -> float:
        """Mean of ``run_secs`` (what the database ranks records by)."""
        secs = self.run_secs
        return sum(secs) / len(secs)


class Measurer:
    """Owns the measurement protocol of a tuning session (see the module doc).

    Args:
        builder: builds the candidates (a ``Builder``).
        runner: times them (a ``Runner``).
        check_correctness: screen would-be bests against the task's baseline (the runner
            must be able to ``run_and_fetch``: ``can_fetch``).
        head_to_head_rounds: rounds of alternating re-timing for close would-be bests
            (0: none).
    """

    def __init__(self, builder: Builder, runner: Runner, check_correctness: bool = True,
                 head_to_head_rounds: int = DEFAULT_ROUNDS) -> None:
        self.builder, self.runner = builder, runner
        self.checker = CorrectnessChecker(builder, runner) if check_correctness else None
        self.rounds = int(head_to_head_rounds)

    def start(self) -> None:
        """Start the builder's and the runner's workers now, without waiting: their start-up
        overlaps the first build."""
        self.builder.start()
        self.runner.start()

    def measure(self, task: Task, traces: list[list | None], incumbent: Incumbent,
                best_secs: float | None = None, baseline_secs: float | None = None,
                while_building: Callable[[], None] | None = None,
                deadline: float | None = None) -> list[Measured]:
        """Build, time, screen and challenge one batch of ``task``; one ``Measured`` per trace,
        in order. When a trace is still building at ``deadline`` (time.monotonic: the
        session's limit) nothing of the batch is measured: every ``Measured`` has the error
        ``ERROR_NOT_BUILT`` and the tuner records nothing for them. A trace None is the task's
        baseline (``baseline.baseline_module``), built with the batch's candidates and timed
        with them, first (``_first_baseline_call``).

        ``incumbent`` is the task's protocol state (updated here: the batch's new best, the
        reference); ``best_secs`` and ``baseline_secs`` are the task's best and untuned
        times so far (None: unknown). ``while_building`` is called once the builds are
        under way (the tuner prepares its next candidates there)."""
        info = task.args_info
        pending = self.builder.submit(task.mod, task.target, traces)
        if while_building is not None:
            while_building()
        builds = pending.result(deadline)
        if any(b.error == ERROR_NOT_BUILT for b in builds):
            # The builds the limit cut still run in the workers: timing the finished ones
            # beside them measured a MobileNetV2 convolution at 4.0-8.0 ms, alone 0.4-0.6
            # ms, and its baseline at 3.2 ms instead of 1.5 (the task was left untuned). The
            # whole batch goes unmeasured: no record, measurable in a later session.
            self.builder.discard([b.artifact_path for b in builds])
            return [Measured(trace, BuildResult(None, ERROR_NOT_BUILT, 0.0),
                             RunResult(None, ERROR_NOT_BUILT)) for trace in traces]
        artifacts = [b.artifact_path for b in builds]
        cands = [i for i, t in enumerate(traces) if t is not None]
        best = best_secs or baseline_secs
        # Cut losses on hopeless candidates: time them once when one call takes over twice the
        # best (or past a second: such a kernel is timed well enough by one call).
        max_secs = _BASELINE_MAX_SECS if best is None else min(
            max(_CUT_RATIO * best, _MIN_CUT_SECS), _BASELINE_MAX_SECS)
        runs = [RunResult(None, b.error if b.error == ERROR_NOT_BUILT else "not run")
                for b in builds]
        # a fast baseline is timed in the candidates' rounds, first (it sets their cut-off):
        # a spell of load on the machine then falls on it and them alike
        timed = []
        for i in (i for i, t in enumerate(traces)
                  if t is None and builds[i].error != ERROR_NOT_BUILT):
            first = self._first_baseline_call(task, info, artifacts[i])
            if first is None:
                timed.append(i)
            else:
                runs[i] = first
        timed += cands
        if timed:
            for i, run in zip(timed, self.runner.run([artifacts[i] for i in timed], info,
                                                     task.target, max_secs=max_secs)):
                runs[i] = run
        if cands and self.checker is not None:  # wrong would-be bests fail
            screened = self.checker.screen(task.task_name, task.mod, task.target, info,
                                           [artifacts[i] for i in cands],
                                           [runs[i] for i in cands], best_secs)
            for i, run in zip(cands, screened):
                runs[i] = run
        if cands and self.rounds > 0:
            challenged = self.challenge(task, incumbent, best_secs,
                                        [artifacts[i] for i in cands],
                                        [runs[i] for i in cands], info)
            for i, run in zip(cands, challenged):
                runs[i] = run
        batch = [Measured(trace, build, run) for trace, build, run in zip(traces, builds, runs)]
        for m in batch:
            if not m.ok:
                logger.debug("%s: %s failed: %s", task.task_name,
                             "baseline" if m.trace is None else "candidate", m.error)
        self._keep(incumbent, batch, best_secs)
        return batch

    def challenge(self, task: Task, incumbent: Incumbent, best_secs: float | None,
                  artifacts: list[str | None], runs: list[RunResult],
                  info: list) -> list[RunResult]:
        """``runs`` with every would-be best (faster than the best so far, ``best_secs``, by
        less than ``_CLEAR_WIN``) re-timed head-to-head against the task's reference kernel
        and recorded in its frame: reference secs x the per-round ratios
        (``relax_tune.measure.head_to_head``). Up to ``_MAX_CHALLENGES`` per batch, fastest
        first.

        The reference stays fixed (the best when the first head-to-head was needed) instead
        of following each winner: chaining ratios would compound the winners' luck, a little
        per noisy win, into a best far faster than any re-timing. Only a clear winner (timed
        ``_CLEAR_WIN`` times faster) becomes the new reference, with its own timing: ratios
        between kernels that far apart are less steady."""
        out = list(runs)
        best = best_secs
        if best is None or incumbent.trace is None:
            return out
        if incumbent.reference is None or not os.path.exists(incumbent.reference[0]):
            artifact = self._incumbent_artifact(task, incumbent)
            incumbent.reference = None if artifact is None else (artifact, best)
        screened = True  # the fastest would-be best has passed the correctness screen
        done: set[int] = set()
        for _ in range(_MAX_CHALLENGES):
            pending = [i for i, r in enumerate(out)
                       if i not in done and r.ok and artifacts[i] and r.mean_secs < best]
            if not pending or incumbent.reference is None:
                break
            i = min(pending, key=lambda j: out[j].mean_secs)
            done.add(i)
            if out[i].mean_secs * _CLEAR_WIN < best:
                best = out[i].mean_secs
                incumbent.reference = (artifacts[i], best)  # type: ignore[assignment]
                screened = False
                continue
            if not screened and self.checker is not None:
                error = self.checker.check(task.task_name, task.mod, task.target, info,
                                           artifacts[i])  # type: ignore[arg-type]
                if error is not None:
                    logger.warning("%s: candidate %d is recorded as failed: %s",
                                   task.task_name, i, error)
                    out[i] = RunResult(None, error, out[i].device)
                    continue
            screened = False
            ref_artifact, ref_secs = incumbent.reference
            ratios = head_to_head(self.runner, ref_artifact, artifacts[i], info,  # type: ignore[arg-type]
                                  task.target, self.rounds)
            if ratios is None:  # the reference (or the challenger) failed to run: keep its time
                logger.debug("%s: head-to-head failed; candidate %d keeps its own timing",
                             task.task_name, i)
                continue
            secs = [ref_secs * r for r in ratios]
            mean = sum(secs) / len(secs)
            logger.debug("%s: head-to-head of candidate %d: %.4g ms timed, %.4g ms against the "
                         "reference (%.4g ms)", task.task_name, i, out[i].mean_secs * 1e3,
                         mean * 1e3, ref_secs * 1e3)
            out[i] = RunResult(secs, None, out[i].device)
            best = min(best, mean)
        return out

    def _incumbent_artifact(self, task: Task, incumbent: Incumbent) -> str | None:
        """The library of the task's best so far: the one built in this session, or built now
        from its record's trace (a resumed run)."""
        if incumbent.artifact is not None and os.path.exists(incumbent.artifact):
            return incumbent.artifact
        build = self.builder.build(task.mod, task.target, [incumbent.trace])[0]
        incumbent.artifact = build.artifact_path if build.ok else None
        return incumbent.artifact

    def _first_baseline_call(self, task: Task, info: list,
                             artifact: str | None) -> RunResult | None:
        """The untuned function's first call, on the correctness check's inputs (its outputs
        become the check's reference, so the untuned function is not built again for it):
        that call is its time when it is slow (over ``_BASELINE_ONE_CALL_SECS``), and the
        result is returned. None: a fast one, to be timed as the candidates are, in their
        rounds (a single first call of a fast function carries one-off costs: the demo MLP's
        untuned matmul 3.2 ms cold, 0.3 ms timed; the speedups reported are against the
        baseline's time). Without the check (or a runner that cannot fetch outputs) it is
        timed here, alone."""
        target = task.target
        if artifact is None:
            return RunResult(None, "the untuned function did not build")
        if self.checker is not None and self.runner.can_time_and_fetch:
            try:
                secs = self.runner.time_and_fetch(artifact, info, target, seed=self.checker.seed)
            except MeasureError as err:
                if str(err) in (ERROR_TIMEOUT, ERROR_CRASHED):  # would only happen again
                    return RunResult(None, str(err))
                logger.debug("untuned function failed its first call: %s", err)  # timed below
            else:
                self.checker.use_reference(task.task_name, task.mod, target, info, artifact)
                return RunResult([secs], None) if secs > _BASELINE_ONE_CALL_SECS else None
        return self.runner.run([artifact], info, target, max_secs=_BASELINE_ONE_CALL_SECS)[0]

    def _keep(self, incumbent: Incumbent, batch: list[Measured],
              best_secs: float | None) -> None:
        """Make the batch's new best (valid and faster than the best so far: the rule the
        tuner's report follows) the incumbent, and discard every library of the batch that
        is neither the incumbent's nor the reference's."""
        best = best_secs
        for m in batch:
            if m.trace is None or not m.ok:
                continue
            if best is None or m.mean_secs < best:
                best = m.mean_secs
                incumbent.trace, incumbent.artifact = m.trace, m.build.artifact_path
        keep = {incumbent.artifact, incumbent.reference[0] if incumbent.reference else None}
        self.builder.discard([m.build.artifact_path for m in batch
                              if m.build.artifact_path not in keep])
