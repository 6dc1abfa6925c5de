"""``LocalRunner``: time built candidates on this machine's device, in interleaved rounds."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

import numpy as np
import tvm

from ..utils import RelaxTuneError, parse_target
from . import _worker, cross
from .base import (ERROR_CRASHED, ERROR_TIMEOUT, MeasureError, Runner, RunResult, logger,
                   short_error, shutdown_pool, worker_import_error, worker_output)
from .worker_pool import WorkerPool

_DEFAULT_SEED = 42
_MIN_CUT_SECS = 1e-3
"""Never cut a candidate whose warm-up call is under this: short calls carry one-off costs."""
_MAX_MEMO_BYTES = 256 << 20
"""Outputs of ``time_and_fetch`` kept for later ``run_and_fetch`` calls, at most this much."""


def _time_and_fetch(artifact: str, args_info_json: str, device_type: int, device_id: int,
                    seed: int) -> tuple[float, list[np.ndarray] | None, str | None]:
    """Runs in the runner's worker: ``_worker.fetch_outputs`` and the seconds it took. A GPU
    is readied before the clock starts: the worker's first use of it creates its context,
    which costs far more than a small kernel's call and would stand as the baseline's time
    (a slow one-call time is kept as it is)."""
    if device_type != 1:  # kDLCPU: nothing to ready
        try:
            tvm.runtime.empty((1,), "uint8", _worker._device(device_type, device_id))
        except Exception:  # noqa: BLE001 - fetch_outputs reports a missing device
            pass
    start = time.perf_counter()
    arrays, error = _worker.fetch_outputs(artifact, args_info_json, device_type, device_id, seed)
    return time.perf_counter() - start, arrays, error


def _file_digest(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


class LocalRunner(Runner):
    """Times candidates with the runtime's time evaluator in one persistent worker process.

    Timings never overlap. The worker loads each artifact with
    ``tvm.runtime.load_module``, makes its inputs once per ``args_info`` (seeded random data,
    cached in the worker) and makes its warm-up calls, candidate by candidate; then the
    batch's candidates are timed in ``repeat`` interleaved rounds, each round one
    measurement of each (``time_evaluator("main", dev, number, 1, min_repeat_ms)``), so a
    spell of load on the machine falls on all of them alike. A candidate whose
    full measurement would not fit in ``timeout_sec`` (judged from the warm-up call) keeps the
    warm-up time as its single ``run_secs`` entry instead of timing out; so does one whose
    warm-up call is over ``max_secs`` (see ``run``), a limit that tightens to ``slow_ratio``
    times the fastest candidate of the batch so far (by its warm-up call). A candidate that
    cannot be loaded, raises, segfaults or runs past ``timeout_sec`` gets a failed
    ``RunResult``; the worker is replaced if it died and the next candidate is timed.

    Args:
        timeout_sec: time limit per candidate (load + warm-up + timing), in seconds.
        number: calls averaged into one measurement.
        repeat: measurements per candidate (the length of ``run_secs``).
        min_repeat_ms: minimum duration of one measurement; ``number`` grows to reach it
            (5 ms: a microsecond kernel is otherwise timed by a few calls, all timer noise;
            kernels of 2 ms and more are unaffected).
        enable_cpu_cache_flush: flush the CPU caches before every timed call
            (``cache_flush_cpu_non_first_arg``: every argument but the first, so a
            kernel's weights come from memory as they do inside a whole model while its
            input stays cached; CPU targets only). Each of the ``repeat`` measurements is
            then one call (``number`` and ``min_repeat_ms`` do not apply).
        slow_ratio: within a batch run with ``max_secs``, a candidate whose warm-up call
            takes more than this many times the batch's fastest candidate so far is not
            timed further (its warm-up time is its measurement); 0 turns this off.
        near_ratio: within a batch run with ``max_secs``, a candidate whose warm-up call
            is over this many times the best time known (``max_secs / slow_ratio``, or the
            batch's fastest so far) is timed by ``repeat`` single calls instead of
            ``repeat`` x ``number``: it is unlikely to be the best, and a few calls rank it
            well enough. 0 turns this off (every candidate under the cut gets the full
            measurement).
    """

    can_fetch = True
    can_time_and_fetch = True
    one_device = True

    def __init__(self, timeout_sec: float = 30.0, number: int = 3, repeat: int = 3,
                 min_repeat_ms: int = 5, enable_cpu_cache_flush: bool = False,
                 slow_ratio: float = 2.0, near_ratio: float = 1.25) -> None:
        if timeout_sec <= 0:
            raise RelaxTuneError(f"timeout_sec must be positive, not {timeout_sec}")
        if number < 1 or repeat < 1:
            raise RelaxTuneError(f"number and repeat must be at least 1, not {number}, {repeat}")
        if min_repeat_ms < 0:
            raise RelaxTuneError(f"min_repeat_ms must not be negative, not {min_repeat_ms}")
        if slow_ratio < 0 or 0 < slow_ratio <= 1:
            raise RelaxTuneError(f"slow_ratio must be 0 (off) or above 1, not {slow_ratio}")
        if near_ratio < 0 or 0 < near_ratio < 1:
            raise RelaxTuneError(f"near_ratio must be 0 (off) or at least 1, not {near_ratio}")
        self.timeout_sec = float(timeout_sec)
        self.number = int(number)
        self.repeat = int(repeat)
        self.min_repeat_ms = int(min_repeat_ms)
        self.enable_cpu_cache_flush = bool(enable_cpu_cache_flush)
        self.slow_ratio = float(slow_ratio)
        self.near_ratio = float(near_ratio)
        self.seed = _DEFAULT_SEED
        self._memo: OrderedDict[tuple[str, str, int], list[np.ndarray]] = OrderedDict()
        self._pool: WorkerPool | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._starting: list[Future] = []

    @property
    def pool(self) -> WorkerPool:
        """The single-worker pool (started on first use)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this LocalRunner has been shut down")
            if self._pool is None:
                self._pool = WorkerPool(
                    max_workers=1, timeout=self.timeout_sec, initializer=_worker.init_worker,
                    stdout=worker_output(), stderr=worker_output())
            return self._pool

    def check_target(self, target: Any) -> None:
        """RelaxTuneError when this machine has no device of ``target``'s kind (e.g. a cuda
        target without a GPU) or ``target`` names another architecture (``mtriple``):
        every candidate would fail; measure remotely instead."""
        target = parse_target(target)
        if cross.is_foreign(target):  # e.g. aarch64 on x86: built, but cannot run here
            raise RelaxTuneError(
                f"target {target} is for {cross.target_triple(target)} and this machine is "
                f"{cross.host_triple()}: its candidates cannot run here; measure them on the "
                f"device through TVM's RPC tracker (relax-tune tune --rpc "
                f"TRACKER_HOST:PORT:KEY, or runner=relax_tune.measure.RPCRunner(...))")
        kind = target.kind.name
        if kind == "llvm":
            return
        try:
            present = bool(tvm.device(kind, 0).exist)
        except Exception:
            present = False
        if not present:
            raise RelaxTuneError(
                f"no {kind} device on this machine can run candidates for target {target}: "
                f"measure on a machine that has one through TVM's RPC tracker (relax-tune tune "
                f"--rpc TRACKER_HOST:PORT:KEY, or runner=relax_tune.measure.RPCRunner(...))")

    def start(self) -> None:
        """Start the worker process now, without waiting (it imports TVM, about a second),
        so that its start-up overlaps the first builds."""
        self._starting.append(self.pool.submit(os.getpid))

    @staticmethod
    def _device_of(target: tvm.target.Target) -> tuple[int, int]:
        return int(target.get_target_device_type()), 0

    def _where(self, target: Any) -> tuple[int, int, bool]:
        """``(device type, device id, flush)`` for timing on ``target``'s device: the CPU
        caches are flushed only for a CPU target, and only with ``enable_cpu_cache_flush``."""
        device_type, device_id = self._device_of(parse_target(target))
        return device_type, device_id, self.enable_cpu_cache_flush and device_type == 1

    def run(self, artifacts: list[str | None], args_info: list, target: Any,
            max_secs: float | None = None) -> list[RunResult]:
        """Time each artifact's ``main`` on the target's device: warm-up calls candidate by
        candidate, then the measurements in interleaved rounds (a candidate whose rounds
        fail, or whose worker was lost, is timed again alone).

        Args:
            artifacts: paths of exported libraries; None (a failed build) gives a failed
                result without touching the worker.
            args_info: the workload's arguments, ``[["TENSOR", dtype, shape], ...]``
                (``relax_tune.utils.args_info``); the same inputs serve every candidate.
            target: the target the artifacts were built for (its device is used).
            max_secs: when the single warm-up call of a candidate takes longer than this,
                the candidate is not timed further and ``run_secs`` is that one time. The
                same happens when the full measurement would not fit in ``timeout_sec``.
                With ``slow_ratio`` the limit then drops, candidate by candidate, to
                ``slow_ratio`` times the fastest one measured so far in this batch (never
                below 1 ms). None: every candidate is timed in full.

        Returns one ``RunResult`` per artifact, in order; never raises for a candidate.
        """
        if not artifacts:
            return []
        device_type, device_id, flush = self._where(target)
        if max_secs is not None and max_secs >= self.timeout_sec:
            logger.warning("max_secs=%.3g is not below the runner's timeout_sec=%.3g: a slow "
                           "warm-up call times out instead of being cut short",
                           max_secs, self.timeout_sec)
        info_json = json.dumps(args_info)
        results: list[RunResult | None] = []
        ready: list[tuple[int, float]] = []  # (index, seconds of one measurement)
        limit = max_secs
        for artifact in artifacts:
            if artifact is None:
                results.append(RunResult(None, "not built"))
                continue
            short = None
            if limit is not None and self.slow_ratio and self.near_ratio:
                short = max(self.near_ratio * limit / self.slow_ratio, _MIN_CUT_SECS)
            result, call_secs = self._prepare(artifact, info_json, device_type, device_id,
                                              flush, limit, short)
            results.append(result)
            if result is None:  # prepared: timed in the rounds below
                ready.append((len(results) - 1, call_secs[1]))
                secs = call_secs[0]
            else:
                secs = result.mean_secs if result.ok else None
            if limit is not None and self.slow_ratio and secs is not None:
                limit = min(limit, max(self.slow_ratio * secs, _MIN_CUT_SECS))
        for chunk in self._chunks(ready):
            timed = self._time_prepared([artifacts[i] for i in chunk])
            for i, result in zip(chunk, timed):
                results[i] = result if result is not None else self._run_one(
                    artifacts[i], info_json, device_type, device_id, flush, None)
        return results  # type: ignore[return-value]

    def run_on_one_device(self, artifacts: list[str | None], args_info: list,
                          target: Any) -> list[RunResult]:
        """Time each artifact's ``main`` in order, one after another (an artifact may appear
        several times): a head-to-head alternates its two kernels itself, round by round."""
        device_type, device_id, flush = self._where(target)
        info_json = json.dumps(args_info)
        return [RunResult(None, "not built") if artifact is None else
                self._run_one(artifact, info_json, device_type, device_id, flush, None)
                for artifact in artifacts]

    def _prepare(self, artifact: str, info_json: str, device_type: int, device_id: int,
                 flush: bool, max_secs: float | None, short_secs: float | None
                 ) -> tuple[RunResult | None, tuple[float, float] | None]:
        """``_worker.prepare_candidate`` in the worker: ``(result, None)`` when the
        candidate is done with (cut short, or failed), else ``(None, (call secs, secs of one
        measurement))`` and it waits in the worker for ``_time_prepared``."""
        try:
            run_secs, error, ready = self.pool.submit(
                _worker.prepare_candidate, artifact, info_json, device_type, device_id,
                self.number, self.repeat, self.min_repeat_ms, flush, max_secs,
                self.timeout_sec, self.seed, short_secs).result()
        except Exception as err:  # noqa: BLE001 - the same failures as a whole run
            return self._failed(artifact, err), None
        if error is not None:
            logger.debug("run failed for %s: %s", artifact, error)
            return RunResult(None, error), None
        return (RunResult(list(run_secs), None), None) if run_secs is not None else (None, ready)

    def _chunks(self, ready: list[tuple[int, float]]) -> list[list[int]]:
        """The prepared candidates in groups timed together, each group's rounds well within
        the worker's time limit."""
        chunks: list[list[int]] = []
        secs = 0.0
        for index, measurement in ready:
            cost = self.repeat * measurement
            if not chunks or secs + cost > 0.5 * self.timeout_sec:
                chunks.append([])
                secs = 0.0
            chunks[-1].append(index)
            secs += cost
        return chunks

    def _time_prepared(self, artifacts: list[str]) -> list[RunResult | None]:
        """``_worker.time_prepared`` on ``artifacts``: one result each, None for those to
        time again one by one (the interleaved rounds failed: a crash or a lost worker)."""
        try:
            timed = self.pool.submit(_worker.time_prepared, artifacts, self.repeat).result()
        except Exception as err:  # noqa: BLE001 - each is timed alone instead
            logger.debug("interleaved timing failed (%s); timing one by one", err)
            return [None] * len(artifacts)
        return [RunResult(out, None) if isinstance(out, list) else None for out in timed]

    def _failed(self, artifact: str, err: BaseException) -> RunResult:
        if isinstance(err, TimeoutError):
            logger.info("run timed out after %.1f s: %s", self.timeout_sec, artifact)
            return RunResult(None, ERROR_TIMEOUT)
        if isinstance(err, ChildProcessError):
            logger.warning("runner worker crashed on %s", artifact)
            return RunResult(None, ERROR_CRASHED)
        if isinstance(err, ImportError):
            return RunResult(None, worker_import_error(err))
        return RunResult(None, short_error(err))

    def _run_one(self, artifact: str, info_json: str, device_type: int, device_id: int,
                 flush: bool, max_secs: float | None,
                 short_secs: float | None = None) -> RunResult:
        """One candidate loaded, warmed up and timed in one go (``_worker.run_candidate``)."""
        try:
            run_secs, error = self.pool.submit(
                _worker.run_candidate, artifact, info_json, device_type, device_id,
                self.number, self.repeat, self.min_repeat_ms, flush, max_secs,
                self.timeout_sec, self.seed, short_secs).result()
        except Exception as err:  # noqa: BLE001
            return self._failed(artifact, err)
        if error is not None:
            logger.debug("run failed for %s: %s", artifact, error)
            return RunResult(None, error)
        return RunResult(list(run_secs), None)

    def run_and_fetch(self, artifact: str, args_info: list, target: Any,
                      seed: int | None = None) -> list[np.ndarray]:
        """Call ``main`` of ``artifact`` once in the runner's worker on fresh seeded random
        inputs (the same data ``run`` times with, for the same seed) and return every
        argument afterwards as a numpy array -- the outputs are the written ones. Compare two
        candidates of one workload by calling this with the same seed.

        A library byte-identical to one ``time_and_fetch`` already called (same arguments
        and seed) is not called again: its remembered outputs are returned.

        Raises ``MeasureError`` ("timeout", "worker crashed", or the error's first lines).
        """
        seed = self.seed if seed is None else int(seed)
        key = self._memo_key(artifact, args_info, seed)
        if key is not None and key in self._memo:
            self._memo.move_to_end(key)
            return [a.copy() for a in self._memo[key]]
        target = parse_target(target)
        device_type, device_id = self._device_of(target)
        arrays, error = self._call(_worker.fetch_outputs, artifact, json.dumps(args_info),
                                   device_type, device_id, seed)
        if error is not None:
            raise MeasureError(error)
        return arrays

    def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` in the runner's worker; a timeout, a crash or a failed import in the
        worker becomes a ``MeasureError``."""
        try:
            return self.pool.submit(fn, *args).result()
        except TimeoutError:
            raise MeasureError(ERROR_TIMEOUT) from None
        except ChildProcessError:
            raise MeasureError(ERROR_CRASHED) from None
        except ImportError as err:
            raise MeasureError(worker_import_error(err)) from None

    def time_and_fetch(self, artifact: str, args_info: list, target: Any,
                       seed: int | None = None) -> float:
        """``run_and_fetch`` once, in the runner's worker, and return the seconds it took:
        one call of ``main`` on fresh seeded inputs, plus loading the library, making the
        inputs and copying the arguments out (a few milliseconds: an upper bound of the
        call, meant for functions too slow to time repeatedly, such as an untuned one).

        The outputs are remembered, so a later ``run_and_fetch`` of a byte-identical
        library (same arguments and seed) returns them without calling it again: the
        untuned function timed this way is also the correctness check's reference.

        Raises ``MeasureError`` ("timeout", "worker crashed", or the error's first lines).
        """
        target = parse_target(target)
        device_type, device_id = self._device_of(target)
        seed = self.seed if seed is None else int(seed)
        secs, arrays, error = self._call(_time_and_fetch, artifact, json.dumps(args_info),
                                         device_type, device_id, seed)
        if error is not None:
            raise MeasureError(error)
        key = self._memo_key(artifact, args_info, seed)
        if key is not None:
            self._memo[key] = arrays
            while len(self._memo) > 1 and sum(
                    a.nbytes for arrs in self._memo.values() for a in arrs) > _MAX_MEMO_BYTES:
                self._memo.popitem(last=False)
        return float(secs)

    @staticmethod
    def _memo_key(artifact: str, args_info: list, seed: int) -> tuple[str, str, int] | None:
        digest = _file_digest(artifact)
        return None if digest is None else (digest, json.dumps(args_info), seed)

    def shutdown(self) -> None:
        """Stop the worker process. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            shutdown_pool(pool, self._starting)
