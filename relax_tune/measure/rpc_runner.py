"""``RPCRunner``: time built candidates on remote devices through TVM's RPC tracker."""

from __future__ import annotations

import importlib
import json
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

import numpy as np
import tvm
from tvm.support.popen_pool import PopenPoolExecutor

from ..utils import RelaxTuneError, parse_target
from . import _rpc_worker
from .base import (ERROR_CRASHED, ERROR_TIMEOUT, MeasureError, Runner, RunResult, logger,
                   short_error, worker_import_error, worker_output)

_DEFAULT_SEED = 42
_SERVER_POLL_SECS = 0.25


def parse_tracker(tracker: str) -> tuple[str, int]:
    """``"host:port"`` -> ``(host, port)``; RelaxTuneError naming the bad value otherwise."""
    host, sep, port = str(tracker).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RelaxTuneError(f"RPC tracker {tracker!r} is not host:port (e.g. 127.0.0.1:9190)")
    return host, int(port)


def parse_rpc_spec(spec: str) -> tuple[str, str]:
    """``"host:port:key"`` (the CLI's ``--rpc``) -> ``("host:port", key)``."""
    rest, sep, key = str(spec).rpartition(":")
    try:
        if not sep or not key:
            raise RelaxTuneError("no key")
        parse_tracker(rest)
    except RelaxTuneError:
        raise RelaxTuneError(f"--rpc {spec!r} is not host:port:key "
                             "(e.g. 127.0.0.1:9190:cpu)") from None
    return rest, key


class RPCRunner(Runner):
    """Times candidates on the servers registered under ``key`` at an RPC tracker.

    The same interface as ``LocalRunner`` (``run``, ``run_and_fetch``, ``shutdown``, context
    manager), so ``tune_tasks(..., runner=RPCRunner(...))`` and the passes' ``runner=`` take it
    as it is. Each candidate gets its own session: the tracker hands out a free server, the
    local build is uploaded, loaded, called once (warm-up) and timed with the time evaluator,
    and the session is released before the next candidate (a server serves one session at a
    time). One session per server is open at once, so a batch spreads over every server
    under the key, and two candidates never share a device while being timed.

    Faults: each session runs in a worker process with a time limit of
    ``request_timeout_sec + session_timeout_sec``; the server also ends the session after
    ``session_timeout_sec``. A candidate whose session was lost -- server killed, hung or gone,
    connection dropped, session expired, no server free in time -- is retried on another
    server up to ``max_retries`` times, then recorded as failed with the last error. A
    candidate that fails on its own (cannot be loaded, raises) fails at once. Every result says
    which server measured it (``RunResult.device``, ``key@host:port``).

    A head-to-head (``run_on_one_device``) is the exception to one session per candidate: its
    whole sequence of alternating kernels runs in one session on one server, one kernel at a
    time, so both sides of every round are timed on the same device (spread over servers,
    the rounds would compare two machines, timed at once).

    Note that TVM's Python RPC server stops serving when a kernel kills its session process
    (segfault); with ``max_retries=1`` a crashing candidate can take down at most two servers.

    Args:
        tracker: ``"host:port"`` of the tracker (or give ``tracker_host`` and ``tracker_port``).
        key: the device key the servers registered with (``device_key`` is the same).
        session_timeout_sec: limit of one session (one candidate: upload, load, timing).
        number, repeat, min_repeat_ms, enable_cpu_cache_flush: as in ``LocalRunner``.
        cooldown_sec: pause between repeats on the device (``cooldown_interval_ms``).
        priority: the tracker request priority.
        max_retries: how often a candidate whose session was lost is tried again.
        request_timeout_sec: how long to wait for a free server before giving up on a try.
        max_parallel: the most sessions open at once (default: the servers under the key).
    """

    can_fetch = True
    can_time_and_fetch = False
    one_device = False  # run spreads a batch over the servers; see run_on_one_device

    def __init__(self, tracker: str | None = None, key: str | None = None, *,
                 tracker_host: str | None = None, tracker_port: int | None = None,
                 device_key: str | None = None, session_timeout_sec: float = 60.0,
                 number: int = 3, repeat: int = 3, min_repeat_ms: int = 0,
                 cooldown_sec: float = 0.0, enable_cpu_cache_flush: bool = False,
                 priority: int = 1, max_retries: int = 1, request_timeout_sec: float = 60.0,
                 max_parallel: int | None = None) -> None:
        if tracker is None and tracker_host is not None and tracker_port is not None:
            tracker = f"{tracker_host}:{tracker_port}"
        if tracker is None:
            raise RelaxTuneError("RPCRunner needs tracker='host:port' (or tracker_host= and "
                                 "tracker_port=)")
        key = key if key is not None else device_key
        self.tracker_host, self.tracker_port = parse_tracker(tracker)
        if not key or not isinstance(key, str):
            raise RelaxTuneError(f"RPC device key must be a non-empty string, not {key!r}")
        if session_timeout_sec <= 0 or request_timeout_sec <= 0:
            raise RelaxTuneError("session_timeout_sec and request_timeout_sec must be positive")
        if number < 1 or repeat < 1 or min_repeat_ms < 0 or cooldown_sec < 0 or max_retries < 0:
            raise RelaxTuneError("number and repeat must be >= 1; min_repeat_ms, cooldown_sec "
                                 "and max_retries must not be negative")
        self.key = key
        self.session_timeout_sec = float(session_timeout_sec)
        self.request_timeout_sec = float(request_timeout_sec)
        self.number, self.repeat, self.min_repeat_ms = int(number), int(repeat), int(min_repeat_ms)
        self.cooldown_sec = float(cooldown_sec)
        self.enable_cpu_cache_flush = bool(enable_cpu_cache_flush)
        self.priority = int(priority)
        self.max_retries = int(max_retries)
        self.max_parallel = max_parallel
        self.seed = _DEFAULT_SEED
        self._pool: PopenPoolExecutor | None = None
        self._pool_size = 0
        self._lock = threading.Lock()
        self._closed = False
        self._tracker_client: Any = None
        self.stats = {"sessions": 0, "retries": 0, "failed": 0}
        """Counts over this runner's life: sessions opened, candidates retried after a lost
        session, candidates recorded as failed."""
        self._check_tracker()

    @property
    def tracker(self) -> str:
        """``host:port`` of the tracker."""
        return f"{self.tracker_host}:{self.tracker_port}"

    def __repr__(self) -> str:
        return f"RPCRunner(tracker={self.tracker!r}, key={self.key!r})"

    # ------------------------------------------------------------------ tracker
    def _check_tracker(self) -> None:
        try:
            # a quick probe first: connect_tracker itself retries for a minute
            socket.create_connection((self.tracker_host, self.tracker_port), timeout=5).close()
            self._tracker_client = tvm.rpc.connect_tracker(self.tracker_host, self.tracker_port)
            self._tracker_client.summary()
        except Exception as err:  # noqa: BLE001 - any failure: the tracker is not there
            raise RelaxTuneError(f"cannot reach the RPC tracker at {self.tracker} "
                                 f"({short_error(err, max_lines=1)}): start it with "
                                 "`python -m tvm.exec.rpc_tracker --port PORT` or fix the "
                                 "address") from None

    def servers(self) -> int:
        """How many servers are registered under the key now (0 when the tracker is gone)."""
        for _ in range(2):
            try:
                summary = self._tracker_client.summary()
                return sum(1 for s in summary.get("server_info", ())
                           if s.get("key", "") == "server:" + self.key)
            except Exception:  # noqa: BLE001 - reconnect once
                try:
                    self._tracker_client = tvm.rpc.connect_tracker(self.tracker_host,
                                                                   self.tracker_port)
                except Exception:  # noqa: BLE001
                    return 0
        return 0

    def _wait_for_servers(self) -> int:
        deadline = time.monotonic() + self.request_timeout_sec
        while True:
            n = self.servers()
            if n or time.monotonic() >= deadline:
                return n
            time.sleep(_SERVER_POLL_SECS)

    # ------------------------------------------------------------------ pool
    def _get_pool(self, size: int) -> PopenPoolExecutor:
        with self._lock:
            if self._closed:
                raise RuntimeError("this RPCRunner has been shut down")
            if self._pool is None or self._pool_size < size:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = PopenPoolExecutor(
                    max_workers=size, timeout=self.request_timeout_sec + self.session_timeout_sec,
                    initializer=importlib.import_module, initargs=(_rpc_worker.__name__,),
                    stdout=worker_output(), stderr=worker_output())
                self._pool_size = size
            return self._pool

    def _submit(self, pool: PopenPoolExecutor, artifact: str, info_json: str,
                device_type: int, flush: bool, max_secs: float | None, seed: int,
                fetch: bool) -> Future:
        return pool.submit(
            _rpc_worker.rpc_run_candidate, self.tracker_host, self.tracker_port, self.key,
            self.priority, self.session_timeout_sec, artifact, info_json, device_type,
            self.number, self.repeat, self.min_repeat_ms, int(self.cooldown_sec * 1000), flush,
            max_secs, seed, fetch)

    @staticmethod
    def _outcome(future: Future) -> tuple[Any, str | None, str | None, bool]:
        """``(value, error, device, session_lost)`` of a finished worker task."""
        try:
            return future.result()
        except TimeoutError:
            return None, ERROR_TIMEOUT, None, True
        except ChildProcessError:
            return None, ERROR_CRASHED, None, True
        except ImportError as err:
            return None, worker_import_error(err), None, False
        except Exception as err:  # noqa: BLE001
            return None, short_error(err), None, False

    # ------------------------------------------------------------------ Runner
    def run(self, artifacts: list[str | None], args_info: list, target: Any,
            max_secs: float | None = None) -> list[RunResult]:
        """Time each artifact's ``main`` on a server under the key (see the class doc).

        ``artifacts``, ``args_info``, ``target`` and ``max_secs`` mean what they mean for
        ``LocalRunner.run``. Returns one ``RunResult`` per artifact, in order, each with the
        ``device`` that measured it; never raises for a candidate or a server."""
        if not artifacts:
            return []
        target = parse_target(target)
        device_type = int(target.get_target_device_type())
        flush = self.enable_cpu_cache_flush and device_type == 1
        info_json = json.dumps(args_info)
        results: list[RunResult | None] = [None] * len(artifacts)
        todo = [i for i, a in enumerate(artifacts) if a is not None]
        for i, a in enumerate(artifacts):
            if a is None:
                results[i] = RunResult(None, "not built")
        if not todo:
            return results  # type: ignore[return-value]
        n_servers = self._wait_for_servers()
        if n_servers == 0:
            msg = (f"no RPC server registered under key {self.key!r} at tracker {self.tracker} "
                   f"within {self.request_timeout_sec:g} s")
            logger.error(msg)
            for i in todo:
                results[i] = RunResult(None, msg)
            return results  # type: ignore[return-value]
        parallel = max(1, min(self.max_parallel or n_servers, n_servers, len(todo)))
        pool = self._get_pool(max(parallel, self._pool_size))
        tries = {i: 0 for i in todo}
        queue = list(todo)
        running: dict[Future, int] = {}
        start = time.perf_counter()
        while queue or running:
            while queue and len(running) < parallel:
                i = queue.pop(0)
                tries[i] += 1
                self.stats["sessions"] += 1
                running[self._submit(pool, artifacts[i], info_json, device_type, flush,
                                     max_secs, self.seed, False)] = i
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                value, error, device, lost = self._outcome(future)
                if error is None:
                    results[i] = RunResult([float(x) for x in value], None, device)
                    continue
                if lost and tries[i] <= self.max_retries:
                    logger.warning("candidate %d lost its session on %s (%s); retrying on "
                                   "another server", i, device or "a server", error)
                    self.stats["retries"] += 1
                    queue.append(i)
                    continue
                if lost:
                    error = f"{error} (session lost {tries[i]} times)"
                logger.debug("run failed on %s: %s", device, error)
                self.stats["failed"] += 1
                results[i] = RunResult(None, error, device)
            if queue and not running:
                # retries pending: open no more sessions than servers are left
                parallel = max(1, min(parallel, self.servers()))
        logger.debug("timed %d candidates over %d servers in %.2f s", len(todo), n_servers,
                     time.perf_counter() - start)
        return results  # type: ignore[return-value]

    def run_on_one_device(self, artifacts: list[str | None], args_info: list,
                          target: Any) -> list[RunResult]:
        """Time each artifact's ``main`` in order, one after another, in one session on one
        server (``Runner.run_on_one_device``; what a head-to-head needs): each distinct
        library is uploaded and loaded once, and every timing is a warm-up call and the time
        evaluator. A lost session retries the whole sequence on a server (``max_retries``);
        every result names the server that measured it. Never raises for a candidate."""
        if not artifacts:
            return []
        target = parse_target(target)
        device_type = int(target.get_target_device_type())
        flush = self.enable_cpu_cache_flush and device_type == 1
        results: list[RunResult | None] = [
            RunResult(None, "not built") if a is None else None for a in artifacts]
        todo = [i for i, a in enumerate(artifacts) if a is not None]
        if not todo:
            return results  # type: ignore[return-value]
        if self._wait_for_servers() == 0:
            msg = (f"no RPC server registered under key {self.key!r} at tracker {self.tracker} "
                   f"within {self.request_timeout_sec:g} s")
            logger.error(msg)
            return [r or RunResult(None, msg) for r in results]
        pool = self._get_pool(max(1, self._pool_size))
        sequence = [artifacts[i] for i in todo]
        tries = 0
        while True:
            tries += 1
            self.stats["sessions"] += 1
            future = pool.submit(
                _rpc_worker.rpc_run_sequence, self.tracker_host, self.tracker_port, self.key,
                self.priority, self.session_timeout_sec, sequence, json.dumps(args_info),
                device_type, self.number, self.repeat, self.min_repeat_ms,
                int(self.cooldown_sec * 1000), flush, self.seed)
            value, error, device, lost = self._outcome(future)
            if error is None:
                for i, (secs, err) in zip(todo, value):
                    if err is None:
                        results[i] = RunResult([float(x) for x in secs], None, device)
                    else:
                        self.stats["failed"] += 1
                        results[i] = RunResult(None, err, device)
                return results  # type: ignore[return-value]
            if not lost or tries > self.max_retries:
                break
            logger.warning("a sequence of %d runs lost its session on %s (%s); retrying",
                           len(sequence), device or "a server", error)
            self.stats["retries"] += 1
        if lost:
            error = f"{error} (session lost {tries} times)"
        logger.debug("sequence failed on %s: %s", device, error)
        self.stats["failed"] += len(todo)
        return [r or RunResult(None, error, device) for r in results]

    def run_and_fetch(self, artifact: str, args_info: list, target: Any,
                      seed: int | None = None) -> list[np.ndarray]:
        """Call ``main`` of ``artifact`` once on a server, on fresh seeded random inputs (the
        same data ``LocalRunner.run_and_fetch`` makes for the same seed), and return every
        argument afterwards as numpy arrays. Raises ``MeasureError`` when it cannot."""
        target = parse_target(target)
        n_servers = self._wait_for_servers()
        if n_servers == 0:
            raise MeasureError(f"no RPC server under key {self.key!r} at {self.tracker}")
        pool = self._get_pool(max(1, self._pool_size))
        error = "not tried"
        for _ in range(self.max_retries + 1):
            value, error, _device, lost = self._outcome(self._submit(
                pool, artifact, json.dumps(args_info), int(target.get_target_device_type()),
                False, None, self.seed if seed is None else int(seed), True))
            if error is None:
                return value
            if not lost:
                break
        raise MeasureError(error)

    def shutdown(self) -> None:
        """Stop the worker processes (each session is already released). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._tracker_client is not None:
            try:
                self._tracker_client.close()
            except Exception:  # noqa: BLE001
                pass
            self._tracker_client = None
