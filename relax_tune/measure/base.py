"""Result records and the two small interfaces of measurement: ``Builder`` and ``Runner``.

A builder turns (workload, trace) pairs into exported shared libraries; a runner times those
libraries on a device. Both work in batches and return exactly one result per candidate, in
order: a failed candidate gets a failed result, it never raises. Only plain data (strings,
paths, lists of numbers) crosses between them, so a runner on another machine (RPC) can take
the builder's artifact paths and ``args_info`` as they are.

Everything the measurement protocol (``relax_tune.measure.measurer``) asks of a runner is
declared on ``Runner``: the methods, and class attributes saying which of the optional ones
a runner implements (``can_fetch``, ``can_time_and_fetch``, ``one_device``).
"""

from __future__ import annotations

import logging
import math
import time
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any, ClassVar

from ..utils import FAILED_RUN_SECS

logger = logging.getLogger("relax_tune.measure")

ERROR_TIMEOUT = "timeout"
"""Error text of a candidate that ran past its per-candidate time limit (its worker is killed)."""
ERROR_CRASHED = "worker crashed"
"""Error text of a candidate whose worker process died (segfault, abort, out of memory)."""
ERROR_NOT_BUILT = "not built before the session's time limit"
"""The build result of a candidate still building at the session's deadline: it was never
measured (the tuner records nothing for it, and a resumed session may measure it)."""

_MAX_ERROR_LINES = 6
_MAX_ERROR_CHARS = 600


def short_error(err: BaseException | str, max_lines: int = _MAX_ERROR_LINES,
                max_chars: int = _MAX_ERROR_CHARS) -> str:
    """A short one-to-few-line description of an error: ``Type: message``, trimmed.

    Python tracebacks (``Traceback (most recent call last): ...`` as the worker pool formats
    them) are reduced to their last lines, which carry the exception and its message.
    """
    if isinstance(err, BaseException):
        text = str(err).strip()
        name = type(err).__name__
        if not text:
            text = name
        elif not text.startswith(name) and "Traceback (most recent call last)" not in text:
            text = f"{name}: {text}"
    else:
        text = str(err).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and lines[0].startswith("Traceback (most recent call last)"):
        # keep the tail: "File ..." frames are noise, the message is at the end
        tail = []
        for line in reversed(lines):
            if line.startswith("  File ") or line.startswith("    "):
                if tail:
                    break
                continue
            tail.append(line)
        lines = list(reversed(tail)) or lines[-1:]
    out = "\n".join(lines[:max_lines])
    if len(out) > max_chars:
        out = out[: max_chars - 3] + "..."
    return out


@dataclass(frozen=True)
class BuildResult:
    """The outcome of building one candidate.

    Attributes:
        artifact_path: the exported shared library (``.so``) exposing a function ``main``
            (or a ``.tar`` of its object files, linked where it is loaded: see
            ``LocalBuilder``'s ``link``), or None when the build failed.
        error: None on success; otherwise a short message (the first lines of the error),
            ``"timeout"`` or ``"worker crashed"``.
        build_secs: seconds spent on this candidate in its worker (trace replay, compile and
            export); the time limit for a timeout, 0.0 when the worker crashed.
    """

    artifact_path: str | None
    error: str | None
    build_secs: float

    @property
    def ok(self) -> bool:
        """True when the candidate was built and exported."""
        return self.error is None and self.artifact_path is not None


@dataclass(frozen=True)
class RunResult:
    """The outcome of timing one candidate.

    Attributes:
        run_secs: seconds per call, one entry per repeat (take the median or the mean); a
            single entry when only the warm-up call was measured (see ``LocalRunner.run``'s
            ``max_secs``). None when the candidate failed.
        error: None on success; otherwise a short message, ``"timeout"`` or ``"worker crashed"``.
        device: which device measured it: ``key@host:port`` of the RPC server for a remote
            runner, None for a local one (or when no server was reached).
    """

    run_secs: list[float] | None
    error: str | None
    device: str | None = None

    @property
    def ok(self) -> bool:
        """True when the candidate ran and was timed."""
        return self.error is None and self.run_secs is not None

    @property
    def mean_secs(self) -> float:
        """Mean of ``run_secs``, or ``FAILED_RUN_SECS`` (1e10) for a failed candidate."""
        if not self.ok or not self.run_secs:
            return FAILED_RUN_SECS
        return math.fsum(self.run_secs) / len(self.run_secs)

    def secs_for_record(self) -> list[float]:
        """``run_secs`` as a database record stores it: ``[1e10]`` for a failed candidate
        (what MetaSchedule writes), the measured times otherwise."""
        return list(self.run_secs) if self.ok and self.run_secs else [FAILED_RUN_SECS]


def calls_per_repeat(number: int, min_repeat_ms: int, call_secs: float) -> int:
    """``number`` for the runtime's time evaluator, raised so that ``number`` calls of
    ``call_secs`` (a warm call's time) already last ``min_repeat_ms``.

    The evaluator starts every measurement with ``number`` calls and keeps the first try
    that lasts ``min_repeat_ms``. From a start of three 20 us calls, one pause of the process
    (another program on the core) of ``min_repeat_ms`` ends the first measurement at once,
    a hundred times too slow: 4% of the repeats of a shared 2-core machine's 60 s sessions
    were 1.5x or more off their median, most of them the first.
    """
    if min_repeat_ms <= 0 or call_secs <= 0:
        return number
    return max(number, math.ceil(min_repeat_ms / 1e3 / call_secs))


def worker_output() -> int | None:
    """Where measurement workers write their stdout/stderr: inherited from this process when
    the ``relax_tune.measure`` logger is enabled for DEBUG, else discarded (a crashing
    candidate makes TVM print a long backtrace; the result already says "worker crashed")."""
    import subprocess

    return None if logger.isEnabledFor(logging.DEBUG) else subprocess.DEVNULL


def worker_import_error(err: BaseException) -> str:
    """The error text (also logged) for a worker that cannot import relax_tune: an
    environment problem, not a candidate's, so say what to do."""
    msg = ("measurement worker cannot import relax_tune (" + short_error(err, max_lines=2)
           + "); the workers run `python -m tvm.exec.popen_worker` with this interpreter, so "
           "relax_tune must be installed in it (pip install -e .) and importable")
    logger.error(msg)
    return msg


def shutdown_pool(pool: Any, starting: list[Future], wait_secs: float = 60.0) -> None:
    """Shut down a TVM ``PopenPoolExecutor`` once the start-up jobs in ``starting`` (futures
    of the ``start`` methods) are done.

    Killing a worker whose process is started but whose pipes are not yet open makes TVM's
    ``PopenWorker.kill`` raise AttributeError in the middle of ``shutdown``, with the pool's
    lock held: the pool's ``__del__`` later blocks on that lock forever (a CI run hung 900 s
    in the next test after a tuning call that had nothing to measure stopped its workers
    right after starting them). Should ``shutdown`` fail anyway, the failure is logged and
    the pool marked as shut down, so that its ``__del__`` does nothing."""
    if starting:
        wait(starting, timeout=wait_secs)
    try:
        # Jobs still queued (builds a session's time limit left behind) would otherwise run
        # after the workers are killed, each in a newly started worker: 4.5 s for two
        # queued builds. TVM's pool does not cancel them; its thread pool can.
        pool._threadpool.shutdown(wait=False, cancel_futures=True)
    except Exception:  # noqa: BLE001 - only a faster shutdown is lost
        pass
    _kill_processes(pool)
    for attempt in (1, 2):
        try:
            pool.shutdown(wait=True)
            return
        except Exception as err:  # noqa: BLE001 - a worker left running beats a hung process
            if pool._lock.locked():
                pool._lock.release()
            if attempt == 1 and isinstance(err, AttributeError):
                # the thread reading a worker just killed above may be in its own
                # PopenWorker.kill, which sets _proc to None under ours (EfficientNet-B0's
                # 60 s session): once more, when that kill is done
                time.sleep(0.05)
                continue
            logger.warning("measurement workers not all stopped cleanly: %s", short_error(err))
            pool._shutdown = True
            return


def _kill_processes(pool: Any) -> None:
    """Kill each worker's process (and its children) of a ``PopenPoolExecutor``. TVM's
    ``PopenWorker.kill`` closes the pipe it reads from first, and that close waits for the
    thread blocked reading it: for the job in flight to finish (4.5 s of a 5 s job; choices
    and builds a time limit left running lengthened a session by 0.5-3 s). Killed first, the
    read ends at once and ``shutdown`` only tidies up."""
    from tvm.support.popen_pool import kill_child_processes

    for worker in list(getattr(pool, "_worker_map", {}).values()):
        proc = getattr(worker, "_proc", None)
        if proc is None:
            continue
        try:
            kill_child_processes(proc.pid)  # needs psutil
        except Exception:  # noqa: BLE001 - pool.shutdown tries again
            pass
        try:
            proc.kill()
        except Exception:  # noqa: BLE001 - pool.shutdown kills it then
            pass


class MeasureError(RuntimeError):
    """A measurement helper that returns data (not a result record) could not finish; the
    message is short (``"timeout"``, ``"worker crashed"``, or the first lines of the error)."""


class Builder:
    """Base class of builders: ``build`` a batch of candidates of one workload.

    Subclasses implement ``build`` and, when they hold resources, ``start`` and ``shutdown``.
    A builder is a context manager that shuts down on exit.
    """

    def start(self) -> None:
        """Start the builder's workers now, without waiting, so that their start-up overlaps
        other work (tuning calls it once, before the first batch); by default nothing."""

    def build(self, workload: Any, target: Any, traces: list[list | None]) -> list[BuildResult]:
        """Build one candidate per trace (``None`` = the workload unscheduled); one result per
        trace, in order; never raises for a failing candidate."""
        raise NotImplementedError

    def submit(self, workload: Any, target: Any, traces: list[list | None]) -> "BuildsDone":
        """Start ``build`` and return an object whose ``result()`` gives its results; the
        caller may work meanwhile. By default the builds run here, before returning."""
        return BuildsDone(self.build(workload, target, traces))

    def discard(self, artifacts: list[str | None]) -> None:
        """Delete built artifacts nobody needs any more (tuning calls it after each batch);
        by default artifacts are kept until ``shutdown``."""

    def shutdown(self) -> None:
        """Release the builder's workers and temporary files; idempotent."""

    def __enter__(self) -> "Builder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


class BuildsDone:
    """Builds already finished (what ``Builder.submit`` returns by default)."""

    def __init__(self, results: list[BuildResult]) -> None:
        self._results = results

    def result(self, deadline: float | None = None) -> list[BuildResult]:
        """The build results, one per trace, in order (``deadline``: as
        ``LocalBuilder``'s ``PendingBuild.result``; these are done already)."""
        return self._results


class Runner:
    """Base class of runners: time a batch of built artifacts on the target's device.

    Subclasses implement ``run`` and, when they hold resources, ``start`` and ``shutdown``.
    A runner is a context manager that shuts down on exit. A runner works from artifact paths
    and ``args_info`` only (plain data), so a remote runner can upload the same artifacts.

    The optional parts of the interface, and the class attributes that say whether a runner
    has them (the measurement protocol reads these, never ``hasattr``):

    - ``run_and_fetch`` (``can_fetch``): call once and return the arguments; the correctness
      check needs it.
    - ``time_and_fetch`` (``can_time_and_fetch``): the same, timed; a slow untuned function
      then runs once for both its baseline time and the check's reference.
    - ``run_on_one_device`` (``one_device`` tells whether ``run`` already is it): time
      artifacts one after another on one device; a head-to-head needs it.
    """

    can_fetch: ClassVar[bool] = False
    """``run_and_fetch`` works (the correctness check needs it)."""
    can_time_and_fetch: ClassVar[bool] = False
    """``time_and_fetch`` works."""
    one_device: ClassVar[bool] = True
    """``run`` times every artifact of a batch on one device, one after another, so
    ``run_on_one_device`` is ``run``. A runner that spreads a batch over several devices
    (``RPCRunner``) sets it False and implements ``run_on_one_device`` itself."""

    def run(self, artifacts: list[str | None], args_info: list, target: Any,
            max_secs: float | None = None) -> list[RunResult]:
        """Time each artifact's ``main`` (``None`` gives a failed result); one result per
        artifact, in order; never raises for a failing candidate."""
        raise NotImplementedError

    def run_on_one_device(self, artifacts: list[str | None], args_info: list,
                          target: Any) -> list[RunResult]:
        """Time each artifact's ``main`` in order, one after another, all on one device (an
        artifact may appear several times): what a head-to-head needs, since the point of
        alternating two kernels is that both see the same device in the same moment.
        Results as ``run``'s. By default ``run`` for a ``one_device`` runner."""
        if not self.one_device:
            raise NotImplementedError(f"{type(self).__name__} spreads a batch over devices; "
                                      "it must implement run_on_one_device")
        return self.run(artifacts, args_info, target)

    def run_and_fetch(self, artifact: str, args_info: list, target: Any,
                      seed: int | None = None) -> list[Any]:
        """Call ``main`` of ``artifact`` once on fresh seeded random inputs and return every
        argument afterwards as numpy arrays (see ``LocalRunner.run_and_fetch``). Raises
        ``MeasureError`` when it cannot. Implemented when ``can_fetch``."""
        raise NotImplementedError(f"{type(self).__name__} cannot fetch outputs")

    def time_and_fetch(self, artifact: str, args_info: list, target: Any,
                       seed: int | None = None) -> float:
        """``run_and_fetch`` once and return the seconds it took (see
        ``LocalRunner.time_and_fetch``). Implemented when ``can_time_and_fetch``."""
        raise NotImplementedError(f"{type(self).__name__} cannot time and fetch in one call")

    def check_target(self, target: Any) -> None:
        """Raise RelaxTuneError when this runner has no device that can run ``target``
        (called once per session, before any work). Remote runners cannot know before
        they connect and accept every target."""

    def start(self) -> None:
        """Start the runner's workers now, without waiting, so that their start-up overlaps
        the first builds; by default nothing."""

    def shutdown(self) -> None:
        """Release the runner's workers; idempotent."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
