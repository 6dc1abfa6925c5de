"""``LocalRunner``: time built candidates on this machine's device, one at a time."""

from __future__ import annotations

import importlib
import json
import threading
from typing import Any

import numpy as np
import tvm
from tvm.support.popen_pool import PopenPoolExecutor

from ..utils import RelaxTuneError, ensure_tvm_threads, parse_target
from . import _worker
from .base import (ERROR_CRASHED, ERROR_TIMEOUT, MeasureError, Runner, RunResult, logger,
                   short_error, worker_import_error, worker_output)

_DEFAULT_SEED = 42


class LocalRunner(Runner):
    """Times candidates with the runtime's time evaluator in one persistent worker process.

    Candidates are timed strictly one after another (timings never overlap). The worker
    loads each artifact with ``tvm.runtime.load_module``, makes its inputs once per
    ``args_info`` (seeded random data, cached in the worker), makes one warm-up call and then
    calls ``time_evaluator("main", dev, number, repeat, min_repeat_ms)``. A candidate whose
    full measurement would not fit in ``timeout_sec`` (judged from the warm-up call) keeps the
    warm-up time as its single ``run_secs`` entry instead of timing out. A candidate that
    cannot be loaded, raises, segfaults or runs past ``timeout_sec`` gets a failed
    ``RunResult``; the worker is replaced if it died and the next candidate is timed.

    Args:
        timeout_sec: time limit per candidate (load + warm-up + timing), in seconds.
        number: calls averaged into one measurement.
        repeat: measurements per candidate (the length of ``run_secs``).
        min_repeat_ms: minimum duration of one measurement; ``number`` grows to reach it.
        enable_cpu_cache_flush: flush the CPU caches before every call
            (``cache_flush_cpu_non_first_arg``, CPU targets only).
    """

    def __init__(self, timeout_sec: float = 30.0, number: int = 3, repeat: int = 3,
                 min_repeat_ms: int = 0, enable_cpu_cache_flush: bool = False) -> None:
        if timeout_sec <= 0:
            raise RelaxTuneError(f"timeout_sec must be positive, not {timeout_sec}")
        if number < 1 or repeat < 1:
            raise RelaxTuneError(f"number and repeat must be at least 1, not {number}, {repeat}")
        if min_repeat_ms < 0:
            raise RelaxTuneError(f"min_repeat_ms must not be negative, not {min_repeat_ms}")
        self.timeout_sec = float(timeout_sec)
        self.number = int(number)
        self.repeat = int(repeat)
        self.min_repeat_ms = int(min_repeat_ms)
        self.enable_cpu_cache_flush = bool(enable_cpu_cache_flush)
        self.seed = _DEFAULT_SEED
        self._pool: PopenPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    @property
    def pool(self) -> PopenPoolExecutor:
        """The single-worker pool (started on first use)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this LocalRunner has been shut down")
            if self._pool is None:
                ensure_tvm_threads()  # the worker inherits it: time kernels on every core
                self._pool = PopenPoolExecutor(
                    max_workers=1, timeout=self.timeout_sec, initializer=importlib.import_module,
                    initargs=(_worker.__name__,),
                    stdout=worker_output(), stderr=worker_output())
            return self._pool

    @staticmethod
    def _device_of(target: tvm.target.Target) -> tuple[int, int]:
        return int(target.get_target_device_type()), 0

    def run(self, artifacts: list[str | None], args_info: list, target: Any,
            max_secs: float | None = None) -> list[RunResult]:
        """Time each artifact's ``main`` on the target's device, one candidate at a time.

        Args:
            artifacts: paths of exported libraries; None (a failed build) gives a failed
                result without touching the worker.
            args_info: the workload's arguments, ``[["TENSOR", dtype, shape], ...]``
                (``relax_tune.utils.args_info``); the same inputs serve every candidate.
            target: the target the artifacts were built for (its device is used).
            max_secs: when the single warm-up call of a candidate takes longer than this,
                the candidate is not timed further and ``run_secs`` is that one time. The
                same happens when the full measurement would not fit in ``timeout_sec``.

        Returns one ``RunResult`` per artifact, in order; never raises for a candidate.
        """
        if not artifacts:
            return []
        target = parse_target(target)
        device_type, device_id = self._device_of(target)
        flush = self.enable_cpu_cache_flush and device_type == 1  # kDLCPU
        if max_secs is not None and max_secs >= self.timeout_sec:
            logger.warning("max_secs=%.3g is not below the runner's timeout_sec=%.3g: a slow "
                           "warm-up call times out instead of being cut short",
                           max_secs, self.timeout_sec)
        info_json = json.dumps(args_info)
        results: list[RunResult] = []
        for artifact in artifacts:
            if artifact is None:
                results.append(RunResult(None, "not built"))
                continue
            results.append(self._run_one(artifact, info_json, device_type, device_id,
                                         flush, max_secs))
        return results

    def _run_one(self, artifact: str, info_json: str, device_type: int, device_id: int,
                 flush: bool, max_secs: float | None) -> RunResult:
        pool = self.pool
        try:
            run_secs, error = pool.submit(
                _worker.run_candidate, artifact, info_json, device_type, device_id,
                self.number, self.repeat, self.min_repeat_ms, flush, max_secs,
                self.timeout_sec, self.seed).result()
        except TimeoutError:
            logger.info("run timed out after %.1f s: %s", self.timeout_sec, artifact)
            return RunResult(None, ERROR_TIMEOUT)
        except ChildProcessError:
            logger.warning("runner worker crashed on %s", artifact)
            return RunResult(None, ERROR_CRASHED)
        except ImportError as err:
            return RunResult(None, worker_import_error(err))
        except Exception as err:  # noqa: BLE001
            return RunResult(None, short_error(err))
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

        Raises ``MeasureError`` ("timeout", "worker crashed", or the error's first lines).
        """
        target = parse_target(target)
        device_type, device_id = self._device_of(target)
        try:
            arrays, error = self.pool.submit(
                _worker.fetch_outputs, artifact, json.dumps(args_info), device_type, device_id,
                self.seed if seed is None else int(seed)).result()
        except TimeoutError:
            raise MeasureError(ERROR_TIMEOUT) from None
        except ChildProcessError:
            raise MeasureError(ERROR_CRASHED) from None
        except ImportError as err:
            raise MeasureError(worker_import_error(err)) from None
        if error is not None:
            raise MeasureError(error)
        return arrays

    def shutdown(self) -> None:
        """Stop the worker process. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
