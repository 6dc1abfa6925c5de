"""Code that runs inside ``RPCRunner``'s worker processes: one RPC session per call.

Each call asks the tracker for a server under the key, uploads the candidate's library (or,
for a head-to-head, every library of the sequence), times its ``main`` there and releases the
session before returning (the session object is deleted and collected, so the server is free
again). Only plain data crosses back: the times, an error
text, the server that measured, and whether the session (not the candidate) failed, which is
what tells the parent to retry the candidate on another server.
"""

from __future__ import annotations

import gc
import json
import os
from typing import Any

import numpy as np
import tvm
from tvm import rpc
from tvm.rpc import base as rpc_base

from . import prepack
from ._worker import random_inputs
from .base import calls_per_repeat, short_error

_trackers: dict[tuple[str, int], Any] = {}

# Words in an error that mean the connection or the server went away, not the candidate.
_LOST_MARKERS = ("socket", "connection", "broken pipe", "rpcsessiontimeout", "session has expired",
                 "closed", "reset by peer", "eof", "cannot request", "kshutdown", "rpccode::")


def _tracker(host: str, port: int) -> Any:
    tracker = _trackers.get((host, port))
    if tracker is None:
        tracker = _trackers[(host, port)] = rpc.connect_tracker(host, port)
    return tracker


def _request(host: str, port: int, key: str, priority: int,
             session_timeout: float) -> tuple[Any, str]:
    """A session on a free server under ``key`` and that server's ``host:port``.

    This is ``TrackerSession.request`` with the server's address kept, so results can say
    which device measured them."""
    tracker = _tracker(host, port)
    try:
        if tracker._sock is None:  # noqa: SLF001 - reconnect after a dropped tracker link
            tracker._connect()  # noqa: SLF001
        rpc_base.sendjson(tracker._sock, [rpc_base.TrackerCode.REQUEST, key, "", priority])  # noqa: SLF001
        value = rpc_base.recvjson(tracker._sock)  # noqa: SLF001
    except OSError:
        _trackers.pop((host, port), None)
        tracker.close()
        raise
    if value[0] != rpc_base.TrackerCode.SUCCESS:
        raise RuntimeError(f"tracker refused the request for key {key!r}: {value}")
    url, server_port, matchkey = value[1]
    sess = rpc.connect(url, server_port, matchkey, session_timeout)
    return sess, f"{key}@{url}:{server_port}"


def looks_lost(error: str) -> bool:
    """True when ``error`` says the session or server went away rather than the candidate failing."""
    low = error.lower()
    return any(marker in low for marker in _LOST_MARKERS)


def _time_main(module: Any, dev: Any, args: list, number: int, repeat: int,
               min_repeat_ms: int, cooldown_ms: int, cache_flush: bool,
               call_secs: float = 0.0) -> list[float]:
    """``repeat`` timings of ``main`` on the server by the runtime's time evaluator (one
    cold call each with ``cache_flush``, as ``_worker.run_candidate``); ``call_secs``, one
    call's time when known, sets the calls per repeat (``calls_per_repeat``)."""
    if cache_flush:
        number, min_repeat_ms = 1, 0
    number = calls_per_repeat(number, min_repeat_ms, call_secs)
    evaluator = module.time_evaluator(
        "main", dev, number=number, repeat=repeat, min_repeat_ms=min_repeat_ms,
        cooldown_interval_ms=cooldown_ms,
        f_preproc="cache_flush_cpu_non_first_arg" if cache_flush else "")
    return [float(x) for x in evaluator(*args).results]


def rpc_run_candidate(tracker_host: str, tracker_port: int, key: str, priority: int,
                      session_timeout: float, artifact: str, args_info_json: str,
                      device_type: int, number: int, repeat: int, min_repeat_ms: int,
                      cooldown_ms: int, cache_flush: bool, max_secs: float | None, seed: int,
                      fetch: bool) -> tuple[Any, str | None, str | None, bool]:
    """Time (or, with ``fetch``, call once and return the arguments of) ``artifact``'s ``main``
    on a server under ``key``.

    Returns ``(run_secs or arrays, error, device, session_lost)``: ``device`` is
    ``key@host:port`` of the server (None when none was reached) and ``session_lost`` is True
    when the failure was the session's (tracker, connection, server death or session timeout),
    so the candidate deserves another server."""
    stage = "request"
    device: str | None = None
    sess = None
    name = f"rt_{os.getpid()}_{os.path.basename(artifact)}"
    try:
        sess, device = _request(tracker_host, tracker_port, key, priority, session_timeout)
        stage = "upload"
        sess.upload(artifact, target=name)
        stage = "load"
        module = sess.load_module(name)
        dev = sess.device(device_type, 0)
        inputs = random_inputs(json.loads(args_info_json), dev, seed)
        stage = "warm-up call"
        args = prepack.packed_args(module, inputs, prepack.read_plan(artifact), dev)
        module["main"](*args)
        dev.sync()
        if fetch:
            return [a.numpy() if hasattr(a, "numpy") else np.asarray(a) for a in inputs], \
                None, device, False
        stage = "timing"
        first_eval = module.time_evaluator("main", dev, number=1, repeat=1)
        first = float(first_eval(*args).mean)
        if max_secs is not None and first > max_secs:
            return [first], None, device, False
        return _time_main(module, dev, args, number, repeat, min_repeat_ms, cooldown_ms,
                          cache_flush, first), None, device, False
    except Exception as err:  # noqa: BLE001 - every failure becomes a result
        text = f"{stage} failed: {short_error(err)}"
        lost = stage in ("request", "upload") or looks_lost(text)
        return None, text, device, lost
    finally:
        if sess is not None:
            try:
                sess.remove(name)
            except Exception:  # noqa: BLE001 - the server may be gone; nothing to clean then
                pass
        # release the session: the server serves one session at a time
        module = args = inputs = dev = sess = None  # noqa: F841
        gc.collect()


def rpc_run_sequence(tracker_host: str, tracker_port: int, key: str, priority: int,
                     session_timeout: float, artifacts: list[str], args_info_json: str,
                     device_type: int, number: int, repeat: int, min_repeat_ms: int,
                     cooldown_ms: int, cache_flush: bool, seed: int
                     ) -> tuple[list[tuple[list[float] | None, str | None]] | None, str | None,
                                str | None, bool]:
    """Time ``artifacts``' ``main`` one after another, in order, in one session on one server
    under ``key`` (what a head-to-head needs). An artifact listed several times is uploaded
    and loaded once; every timing is a warm-up call and then the time evaluator, as in
    ``rpc_run_candidate``, on one set of seeded inputs.

    Returns ``(results, error, device, session_lost)``: ``results`` holds ``(run_secs,
    error)`` per artifact (a candidate that cannot be loaded or fails fails alone), or is
    None when the session failed as a whole (``error``, ``session_lost`` as in
    ``rpc_run_candidate``)."""
    stage = "request"
    device: str | None = None
    sess = None
    names: list[str] = []
    loaded: dict[str, Any] = {}
    try:
        sess, device = _request(tracker_host, tracker_port, key, priority, session_timeout)
        stage = "load"  # as in rpc_run_candidate: the inputs are made at the load stage
        dev = sess.device(device_type, 0)
        inputs = random_inputs(json.loads(args_info_json), dev, seed)
        for artifact in dict.fromkeys(artifacts):
            if not os.path.isfile(artifact):
                loaded[artifact] = f"upload failed: no such file {artifact}"
                continue
            stage = "upload"
            name = f"rt_{os.getpid()}_{len(names)}_{os.path.basename(artifact)}"
            sess.upload(artifact, target=name)
            names.append(name)
            stage = "load"
            try:
                module = sess.load_module(name)
                loaded[artifact] = (module, prepack.packed_args(
                    module, inputs, prepack.read_plan(artifact), dev))
            except Exception as err:  # noqa: BLE001 - this candidate's failure, unless lost
                text = f"{stage} failed: {short_error(err)}"
                if looks_lost(text):
                    raise
                loaded[artifact] = text
        results: list[tuple[list[float] | None, str | None]] = []
        for artifact in artifacts:
            entry = loaded[artifact]
            if isinstance(entry, str):
                results.append((None, entry))
                continue
            module, args = entry
            try:
                stage = "warm-up call"
                module["main"](*args)
                dev.sync()
                stage = "timing"
                results.append((_time_main(module, dev, args, number, repeat, min_repeat_ms,
                                           cooldown_ms, cache_flush), None))
            except Exception as err:  # noqa: BLE001 - this candidate's failure, unless lost
                text = f"{stage} failed: {short_error(err)}"
                if looks_lost(text):
                    raise
                results.append((None, text))
        return results, None, device, False
    except Exception as err:  # noqa: BLE001 - every failure becomes a result
        text = f"{stage} failed: {short_error(err)}"
        lost = stage in ("request", "upload") or looks_lost(text)
        return None, text, device, lost
    finally:
        if sess is not None:
            for name in names:
                try:
                    sess.remove(name)
                except Exception:  # noqa: BLE001 - the server may be gone; nothing to clean then
                    break
        # release the session: the server serves one session at a time
        loaded.clear()
        module = args = inputs = dev = sess = None  # noqa: F841
        gc.collect()


def tracker_servers(tracker_host: str, tracker_port: int, key: str) -> tuple[int, int]:
    """``(servers registered under key, free ones)`` according to the tracker."""
    summary = _tracker(tracker_host, tracker_port).summary()
    servers = [s for s in summary.get("server_info", ())
               if s.get("key", "") == "server:" + key]
    free = summary.get("queue_info", {}).get(key, {}).get("free", 0)
    return len(servers), int(free)
