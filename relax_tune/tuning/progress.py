"""What a person sees while tuning: one live progress bar and a tuning table per round on a
terminal; plain log lines otherwise; the full log in the work_dir's ``logs/tune.log``."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .timeline import Timeline

if TYPE_CHECKING:
    from .state import TaskReport


logger = logging.getLogger(__name__)


def _applied(report) -> str:
    """What ApplyDatabase will use for the task: its measured best ("tuned"), its predicted
    schedule ("predicted": nothing of the task was measured), or "untuned"."""
    if report.best_secs and report.tuned_applied:
        return "tuned"
    if report.predicted and not report.best_secs and not report.baseline_secs:
        return "predicted"
    return "untuned"


def format_tuning_table(reports: "Sequence[TaskReport]") -> str:
    """The tuning table: task, FLOP, weight, GFLOP/s, latency, weighted latency, trials,
    what is applied (tuned schedule or the untuned function) and whether the task is done."""
    head = (f"{'#':>3} {'task':<28}{'FLOP':>10}{'weight':>7}{'GFLOP/s':>9}{'untuned us':>12}"
            f"{'best us':>10}{'weighted us':>12}{'trials':>7}  {'applied':<10}{'done':<10}")
    lines = [head, "-" * len(head)]
    total = 0.0
    for i, r in enumerate(reports):
        applied = r.applied_secs
        weighted = applied * r.weight if applied else None
        total += weighted or 0.0

        def us(x):
            return f"{x * 1e6:.2f}" if x else "-"
        lines.append(
            f"{i:>3} {r.task_name[:27]:<28}{r.flops:>10.3g}{r.weight:>7}"
            f"{(f'{r.gflops:.2f}' if r.gflops else '-'):>9}{us(r.baseline_secs):>12}"
            f"{us(r.best_secs):>10}{us(weighted):>12}{r.trials:>7}  "
            f"{_applied(r):<10}{r.status:<10}")
    lines.append(f"estimated end-to-end (sum of weighted latencies): {total * 1e6:.2f} us")
    return "\n".join(lines)


class Progress:
    """Progress of one tuning session.

    On a terminal (``stderr`` is a TTY) a tqdm bar shows trials done/total, elapsed time,
    ETA and the current task, and the tuning table is printed above it after each round.
    Otherwise nothing is printed: one INFO log line per batch (and per baseline timed
    before the first trial) goes to the ``relax_tune`` logger. When ``log_file`` is given,
    everything down to DEBUG is also written to it; with ``timeline_file`` each batch's
    task state is appended there (``timeline.Timeline``). With ``max_time`` (given where
    the time limit, not a trial count, is the budget) the bar and the lines count seconds.
    """

    PREDICT_LOG_SECS = 5.0
    """A line about the no-measurement choices at most this often (and at the first and the
    last)."""

    def __init__(self, total: int, log_file: str | None = None,
                 enable_bar: bool | None = None, timeline_file: str | None = None,
                 max_time: float | None = None):
        self.total = total
        self.max_time = max_time
        """The session's time limit where it, not a trial count, is the budget (``max_time``
        alone): the bar and the log lines count its seconds instead of the trials."""
        self._timeline = Timeline(timeline_file) if timeline_file else None
        self.done = 0
        self.start = time.perf_counter()
        self._predict_logged: float | None = None
        self._handler = self._open_log(log_file) if log_file else None
        tty = sys.stderr.isatty() if enable_bar is None else enable_bar
        self._bar = None
        if tty and total > 0:
            from tqdm import tqdm

            if self.max_time is None:
                self._bar = tqdm(total=total, unit="trial", dynamic_ncols=True,
                                 file=sys.stderr)
            else:
                self._bar = tqdm(total=round(self.max_time), unit="s", dynamic_ncols=True,
                                 file=sys.stderr, bar_format="{l_bar}{bar}| {n:.0f}/{total} s"
                                 "{postfix}")

    def _budget(self, elapsed: float) -> str:
        """Trials and seconds so far, against the budget (trials, or ``max_time``)."""
        if self.max_time is None:
            return f"{self.done}/{self.total} trials, {elapsed:.0f} s"
        return f"{self.done} trials, {elapsed:.0f}/{self.max_time:.0f} s"

    def _tick(self, elapsed: float) -> None:
        """The time bar at ``elapsed`` seconds (a bar of seconds only)."""
        if self._bar is not None and self.max_time is not None:
            self._bar.update(max(0.0, min(elapsed, self._bar.total) - self._bar.n))

    def predicted(self, done: int, total: int) -> None:
        """``done`` of ``total`` tasks have their no-measurement choice (what each keeps until
        it is measured, and for good where a time limit leaves it unmeasured)."""
        now = time.perf_counter()
        if self._bar is not None:
            self._bar.set_postfix_str(f"predicting {done}/{total}", refresh=False)
            self._tick(now - self.start)
        if 0 < done < total and self._predict_logged is not None \
                and now - self._predict_logged < self.PREDICT_LOG_SECS:
            return
        self._predict_logged = now
        logger.info("[predicted %d/%d tasks, %.0f s] no-measurement choices: what a task "
                    "runs until it is measured", done, total, now - self.start)

    @staticmethod
    def _open_log(log_file: str) -> logging.Handler | None:
        try:
            os.makedirs(os.path.dirname(log_file) or ".", exist_ok=True)
            handler = logging.FileHandler(log_file)
        except OSError as err:
            logger.warning("cannot write logs to %s (%s); going on without a log file",
                           log_file, err)
            return None
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        _LogTee.install(handler)
        return handler

    def baseline(self, report, index: int, count: int) -> None:
        """The untuned baseline of ``report``'s task was timed (with the task's first
        batch), ``index`` of ``count``."""
        elapsed = time.perf_counter() - self.start
        untuned = f"{report.baseline_secs * 1e6:.2f} us" if report.baseline_secs else "failed"
        if self._bar is not None:
            self._bar.set_postfix_str(f"baseline {index}/{count} {report.task_name[:24]}")
            self._tick(elapsed)
        logger.info("[baseline %d/%d, %.0f s] %s: untuned %s", index, count, elapsed,
                    report.task_name, untuned)

    def advance(self, report, n: int) -> None:
        """``n`` more trials were measured for ``report``'s task."""
        self.done += n
        elapsed = time.perf_counter() - self.start
        best = f"{report.best_secs * 1e6:.2f} us" if report.best_secs else "-"
        if self._bar is not None:
            if self.max_time is None:
                self._bar.set_postfix_str(f"{report.task_name[:24]} best {best}",
                                          refresh=False)
                self._bar.update(n)
            else:
                self._bar.set_postfix_str(f"{self.done} trials, {report.task_name[:24]} "
                                          f"best {best}", refresh=False)
                self._tick(elapsed)
        logger.info("[%s] %s: %d trials, best %s, %d failed", self._budget(elapsed),
                    report.task_name, report.trials, best, report.failures)
        if self._timeline is not None:
            self._timeline.point(report)

    def table(self, reports: Sequence) -> None:
        """Show the tuning table (above the bar on a terminal; at DEBUG in the log)."""
        text = format_tuning_table(reports)
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        logger.debug("tuning table:\n%s", text)

    def close(self) -> None:
        """Stop the bar and the log file."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._handler is not None:
            _LogTee.remove(self._handler)
            self._handler.close()
            self._handler = None


class _LogTee(logging.Handler):
    """Sends every ``relax_tune`` record (DEBUG included) to the log file while the user's own
    handlers above keep seeing only what they saw before: the package logger is lowered to
    DEBUG and stops propagating, and this handler forwards to the parents' handlers the
    records at or above the level that was in force before."""

    _installed: dict[logging.Handler, tuple[logging.Handler, int, bool]] = {}

    def __init__(self, level: int) -> None:
        super().__init__(level)

    def emit(self, record: logging.LogRecord) -> None:
        parent = logging.getLogger("relax_tune").parent
        while parent is not None:
            for h in parent.handlers:
                if record.levelno >= h.level:
                    h.handle(record)
            if not parent.propagate:
                break
            parent = parent.parent

    @classmethod
    def install(cls, file_handler: logging.Handler) -> None:
        pkg = logging.getLogger("relax_tune")
        tee = cls(pkg.getEffectiveLevel())
        cls._installed[file_handler] = (tee, pkg.level, pkg.propagate)
        if pkg.propagate:
            pkg.addHandler(tee)
        pkg.addHandler(file_handler)
        pkg.setLevel(logging.DEBUG)
        pkg.propagate = False

    @classmethod
    def remove(cls, file_handler: logging.Handler) -> None:
        pkg = logging.getLogger("relax_tune")
        tee, level, propagate = cls._installed.pop(file_handler)
        pkg.removeHandler(file_handler)
        pkg.removeHandler(tee)
        pkg.setLevel(level)
        pkg.propagate = propagate
