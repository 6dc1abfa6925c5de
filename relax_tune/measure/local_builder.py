"""``LocalBuilder``: compile candidates in persistent worker processes on this machine."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future, wait

import tvm
from tvm.s_tir import Trace

from ..utils import RelaxTuneError, normalize_mod, parse_target, to_plain, trace_to_json
from . import _worker, cross, prepack
from .base import (ERROR_CRASHED, ERROR_NOT_BUILT, ERROR_TIMEOUT, Builder, BuildResult,
                   BuildsDone, logger,
                   short_error, shutdown_pool, worker_import_error, worker_output)
from .worker_pool import WorkerPool


def _available_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _trace_text(trace: object) -> str | None:
    if trace is None or isinstance(trace, str):
        return trace
    if isinstance(trace, Trace):
        return json.dumps(trace_to_json(trace))
    try:
        return json.dumps(trace)
    except TypeError:  # IntImm/FloatImm straight from Trace.as_json()
        return json.dumps(to_plain(trace))


class LocalBuilder(Builder):
    """Builds candidates in a pool of persistent worker processes.

    Each worker imports TVM once (the pool initializer) and keeps parsed workloads cached by
    the digest of their TVMScript text, so a candidate costs only its trace replay, the
    compile and the export. A worker that crashes or runs past ``timeout_sec`` is killed and
    replaced on its next task (``tvm.support.popen_pool``); the candidate gets a failed
    ``BuildResult`` ("worker crashed" / "timeout") and the batch goes on.

    Args:
        max_workers: worker processes (default: the number of CPU cores).
        timeout_sec: time limit per candidate (replay + compile + export), in seconds.
        artifact_dir: where the exported ``.so`` files go. Default: a temporary directory
            owned by the builder and removed by ``shutdown``. A given directory is created if
            missing and left in place.
        link: how a candidate is linked (``measure/cross.py``). "auto" (default): with the
            host compiler for this machine's architecture; for a target whose ``mtriple``
            names another one (``aarch64-linux-gnu``), with ``<triple>-gcc``/``-g++`` when
            one is on PATH, else as a ``.tar`` of object files that the device links when
            it loads it (TVM's RPC server does). "tar": always the archive. Any other
            string: the compiler that links the ``.so`` (e.g. a cross compiler's path).
    """

    def __init__(self, max_workers: int | None = None, timeout_sec: float = 60.0,
                 artifact_dir: str | None = None, link: str = cross.LINK_AUTO) -> None:
        if max_workers is None:
            max_workers = _available_cores()
        if max_workers < 1:
            raise RelaxTuneError(f"max_workers must be at least 1, not {max_workers}")
        if timeout_sec <= 0:
            raise RelaxTuneError(f"timeout_sec must be positive, not {timeout_sec}")
        if not isinstance(link, str) or not link:
            raise RelaxTuneError(f"link must be 'auto', 'tar' or a compiler, not {link!r}")
        self.link = link
        self._modes: dict[str, str] = {}
        self.max_workers = int(max_workers)
        self.timeout_sec = float(timeout_sec)
        if artifact_dir is None:
            self.artifact_dir = tempfile.mkdtemp(prefix="relax_tune_build_")
            self._owns_dir = True
        else:
            os.makedirs(artifact_dir, exist_ok=True)
            self.artifact_dir = os.path.abspath(artifact_dir)
            self._owns_dir = False
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._session = uuid.uuid4().hex[:8]
        self._closed = False
        self._starting: list[Future] = []

    @property
    def pool(self) -> WorkerPool:
        """The worker pool (started on first use). Tasks submitted here run in the same
        persistent workers as the builds."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this LocalBuilder has been shut down")
            if self._pool is None:
                self._pool = WorkerPool(
                    max_workers=self.max_workers, timeout=self.timeout_sec,
                    initializer=_worker.init_worker,
                    stdout=worker_output(), stderr=worker_output())
            return self._pool

    def start(self) -> None:
        """Start every worker process now, without waiting (each imports TVM, about a second):
        called before the first batch, the start-up overlaps other work instead of the
        first builds. Idempotent."""
        pool = self.pool
        if not self._starting:
            self._starting += [pool.submit(os.getpid) for _ in range(self.max_workers)]

    @property
    def started(self) -> bool:
        """Whether ``start`` was called and every worker has answered (imported TVM)."""
        return bool(self._starting) and all(f.done() for f in self._starting)

    def replay_pool(self) -> ReplayPool:
        """The workers for the searches' replays (``SearchContext.replay_pool``): the
        searches hand them jobs once ``start`` has started them and they are up
        (``ReplayPool.ready``)."""
        return ReplayPool(self)

    def link_mode(self, target: tvm.target.Target | str | dict) -> str:
        """How this builder links candidates for ``target``: "" (the host compiler),
        "tar" (an archive the device links) or a cross compiler (``cross.link_mode``)."""
        target = parse_target(target)
        key = str(target)
        mode = self._modes.get(key)
        if mode is None:
            mode = self._modes[key] = cross.link_mode(target, self.link)
            (logger.info if mode else logger.debug)("%s", cross.describe(target, mode))
        return mode

    def _artifact_path(self, digest: str, ext: str = "so") -> str:
        name = f"{digest[:12]}_{self._session}_{next(self._counter):06d}.{ext}"
        return os.path.join(self.artifact_dir, name)

    def build(self, workload: tvm.IRModule, target: tvm.target.Target | str | dict,
              traces: list[list | None]) -> list[BuildResult]:
        """Replay each plain-JSON trace on ``workload`` in a persistent worker, compile the
        result for ``target`` and export it as a ``.so`` whose entry function is ``main``
        (a ``.tar`` of object files in the archive mode, see ``link``).
        (``submit(...).result()``.)

        ``workload`` is a single-function module keyed ``main`` (``utils.normalize_mod``; a
        bare PrimFunc is normalised here). A trace is the plain JSON of
        ``utils.trace_to_json`` (a JSON string or a ``tvm.s_tir.Trace`` is accepted too);
        None means the task's baseline (the workload as it is; on a GPU target its default
        schedule, ``baseline.baseline_module``). Returns one
        ``BuildResult`` per trace, in order. A trace that fails to replay, a compile error,
        a crashed worker or a timeout gives a failed result; nothing raises for a candidate.
        """
        return self._start(workload, target, traces).result()

    def submit(self, workload: tvm.IRModule, target: tvm.target.Target | str | dict,
               traces: list[list | None]) -> "PendingBuild | BuildsDone":
        """Start building (as ``build``) and return at once; ``result()`` of the returned
        object waits for the results. The caller can do other work meanwhile (the tuner
        prepares the next candidates while the workers compile). A subclass that overrides
        ``build`` alone is built through its ``build``, before this returns."""
        if type(self).build is not LocalBuilder.build:
            return super().submit(workload, target, traces)
        return self._start(workload, target, traces)

    def _start(self, workload: tvm.IRModule, target: tvm.target.Target | str | dict,
               traces: list[list | None]) -> "PendingBuild":
        if not traces:
            return PendingBuild(self, [], "")
        target = parse_target(target)
        if not isinstance(workload, tvm.IRModule):
            workload = normalize_mod(workload)
        script = workload.script()
        digest = _worker.script_digest(script)
        target_json = str(target)
        mode = self.link_mode(target)
        pool = self.pool
        jobs: list[tuple[str, Future | BuildResult]] = []
        for trace in traces:
            out_path = self._artifact_path(digest, "tar" if mode == cross.LINK_TAR else "so")
            try:
                trace_json = _trace_text(trace)
            except Exception as err:  # noqa: BLE001 - not JSON-serialisable: this one fails
                jobs.append((out_path, BuildResult(None, "bad trace: " + short_error(err), 0.0)))
                continue
            future = pool.submit(_worker.build_candidate, digest, script, target_json,
                                 trace_json, out_path, mode)
            jobs.append((out_path, future))
        return PendingBuild(self, jobs, digest)

    def _collect(self, out_path: str, future: Future) -> BuildResult:
        try:
            error, secs = future.result()
        except TimeoutError:
            self._remove(out_path)
            logger.info("build timed out after %.1f s: %s", self.timeout_sec, out_path)
            return BuildResult(None, ERROR_TIMEOUT, self.timeout_sec)
        except ChildProcessError:
            self._remove(out_path)
            logger.warning("build worker crashed on %s", out_path)
            return BuildResult(None, ERROR_CRASHED, 0.0)
        except ImportError as err:
            self._remove(out_path)
            return BuildResult(None, worker_import_error(err), 0.0)
        except Exception as err:  # noqa: BLE001 - e.g. a pickling problem
            self._remove(out_path)
            return BuildResult(None, short_error(err), 0.0)
        if error is not None:
            logger.debug("build failed: %s", error)
            return BuildResult(None, error, float(secs))
        if not os.path.exists(out_path):
            return BuildResult(None, "export produced no file", float(secs))
        return BuildResult(out_path, None, float(secs))

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.remove(path)
        except OSError:
            pass

    def discard(self, artifacts: list[str | None]) -> None:
        """Delete artifacts this builder produced once they are measured (long tuning runs
        otherwise keep every candidate's library on disk). Paths outside ``artifact_dir``
        and None are ignored."""
        root = os.path.abspath(self.artifact_dir)
        for path in artifacts:
            if path and os.path.dirname(os.path.abspath(path)) == root:
                self._remove(path)
                prepack.remove_plan(path)

    def shutdown(self) -> None:
        """Stop the worker processes and, if the builder created its artifact directory,
        remove it with every artifact in it. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            start = time.perf_counter()
            shutdown_pool(pool, self._starting)
            logger.debug("builder pool shut down in %.2f s", time.perf_counter() - start)
        if self._owns_dir:
            shutil.rmtree(self.artifact_dir, ignore_errors=True)


class ReplayPool:
    """A ``LocalBuilder``'s workers as the searches' replay pool, ready once every worker has
    started. A job handed to a worker still importing TVM waits for it: ResNet-18's first
    pooled prediction took 5.6 s for 22 replays, 3 of them in a booting worker, where the
    others took 40 ms each (Intel Xeon, 2 cores); until then the search replays here."""

    def __init__(self, builder: LocalBuilder) -> None:
        self._builder = builder

    @property
    def ready(self) -> bool:
        """Whether jobs may go to the workers now."""
        return self._builder.started

    def submit(self, fn, *args) -> Future:
        """``fn(*args)`` in a worker."""
        return self._builder.pool.submit(fn, *args)


class PendingBuild:
    """Builds under way in a ``LocalBuilder`` (``LocalBuilder.submit``)."""

    def __init__(self, builder: LocalBuilder, jobs: list[tuple[str, Future | BuildResult]],
                 digest: str) -> None:
        self._builder, self._jobs, self._digest = builder, jobs, digest
        self._results: list[BuildResult] | None = None

    def result(self, deadline: float | None = None) -> list[BuildResult]:
        """Wait for every build; one ``BuildResult`` per trace, in order (as ``build``). With
        a ``deadline`` (time.monotonic), a build still running then is left to its worker
        and gets ``ERROR_NOT_BUILT`` (one slow LLVM build, 39 s for a ResNet-18 matmul
        candidate, held a 60 s session until 95 s)."""
        if self._results is None:
            self._results = [self._result_of(path, job, deadline) for path, job in self._jobs]
            if self._results:
                logger.debug("built %d/%d candidates of workload %s",
                              sum(r.ok for r in self._results), len(self._results),
                              self._digest[:12])
        return self._results

    def _result_of(self, path: str, job: Future | BuildResult,
                   deadline: float | None) -> BuildResult:
        if not _done_by(job, deadline):
            return BuildResult(None, ERROR_NOT_BUILT, 0.0)
        return job if isinstance(job, BuildResult) else self._builder._collect(path, job)


def _done_by(future: Future | BuildResult, deadline: float | None) -> bool:
    """Whether ``future`` is done by ``deadline`` (time.monotonic; None: wait for it)."""
    if deadline is None or isinstance(future, BuildResult):
        return True
    wait([future], timeout=max(0.0, deadline - time.monotonic()))
    return future.done()
