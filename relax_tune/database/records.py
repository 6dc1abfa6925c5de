"""Workloads and tuning records: the values a database stores, and their JSON forms.

The JSON forms are exactly MetaSchedule's (``tvm.s_tir.meta_schedule.database``):

- a workload is ``[str(shash), base64(<8-byte little-endian length> + tvm.ir.save_json(mod))]``;
- a tuning record is ``[trace_json, run_secs, target_config, args_info]`` where ``trace_json`` is
  ``Trace.as_json(remove_postproc=False)`` as plain JSON, ``run_secs`` a list of seconds (a failed
  candidate is ``[1e10]``) or ``null``, ``target_config`` the target's JSON dict or ``null`` and
  ``args_info`` ``[["TENSOR", dtype, shape], ...]`` or ``null``.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import logging
import math
import struct
from typing import Any

import tvm
from tvm.s_tir import Schedule, Trace
from tvm.s_tir.schedule import InstructionKind

from ..utils import (
    FAILED_RUN_SECS,
    RelaxTuneError,
    error_line,
    load_ir_json,
    parse_target,
    schedule_from_json,
    structural_hash,
    target_config,
    to_plain,
    trace_to_json,
)

from .validate import MIN_RUN_SECS, check_run_secs

_LENGTH_PREFIX = struct.Struct("<Q")

BASELINE_TRACE: list = [[], []]
"""The empty trace: the function as it was before tuning. Tuning records each task's untuned
function under it (the task's baseline: its time is what speedups are measured against, and
``ApplyDatabase`` keeps the function unchanged when this record is the best)."""


class Workload:
    """A tuning workload: a single-function IRModule and its structural hash.

    ``shash`` is the hash under the module equality of the database that holds the workload
    (``utils.structural_hash(mod)`` when built directly); it is what the workload file stores.
    """

    __slots__ = ("mod", "shash")

    def __init__(self, mod: tvm.IRModule, shash: int | None = None) -> None:
        self.mod = mod
        self.shash = structural_hash(mod) if shash is None else int(shash)

    def __repr__(self) -> str:
        return f"Workload(shash={self.shash})"

    def as_json(self) -> list:
        """``[str(shash), base64(8-byte LE length + tvm.ir.save_json(mod))]`` (MetaSchedule's line)."""
        text = tvm.ir.save_json(self.mod).encode("utf-8")
        payload = _LENGTH_PREFIX.pack(len(text)) + text
        return [str(self.shash), base64.b64encode(payload).decode("ascii")]

    @staticmethod
    def from_json(obj: Any) -> Workload:
        """Parse a workload line's JSON value; raise RelaxTuneError saying what is wrong with it.

        The stored hash is kept as read; databases recompute it under their own equality."""
        if not (isinstance(obj, list) and len(obj) == 2
                and isinstance(obj[0], str) and isinstance(obj[1], str)):
            raise RelaxTuneError("a workload must be [hash_string, base64_module]")
        try:
            shash = int(obj[0])
        except ValueError:
            raise RelaxTuneError(f"workload hash {obj[0][:40]!r} is not a decimal integer") from None
        try:
            raw = base64.b64decode(obj[1], validate=True)
        except (binascii.Error, ValueError) as err:
            raise RelaxTuneError(f"the workload module is not valid base64 ({err})") from None
        if len(raw) >= _LENGTH_PREFIX.size and \
                _LENGTH_PREFIX.unpack_from(raw)[0] == len(raw) - _LENGTH_PREFIX.size:
            text = raw[_LENGTH_PREFIX.size:]
        elif raw[:1] == b"{":  # no length prefix: tolerated on read, never written
            text = raw
        else:
            raise RelaxTuneError("the workload module's length prefix does not match its size "
                                 "(truncated?)")
        try:
            mod = load_ir_json(text.decode("utf-8"))
        except Exception as err:  # TVM raises assorted errors for bad graphs
            first = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            if "Legacy" in first:
                first += " It was written by TVM 0.21 or older: tune again with this TVM"
            raise RelaxTuneError(f"the workload module does not load ({first})") from None
        if not isinstance(mod, tvm.IRModule):
            raise RelaxTuneError(f"the workload holds a {type(mod).__name__}, not an IRModule")
        return Workload(mod, shash)


@functools.lru_cache(maxsize=256)
def _target_from_text(text: str) -> tvm.target.Target:
    return tvm.target.Target(json.loads(text))


def target_from_config(config: dict) -> tvm.target.Target:
    """A Target from its JSON dict, cached per distinct dict (loading many records stays fast);
    raise RelaxTuneError when TVM rejects the dict."""
    try:
        return _target_from_text(json.dumps(config, sort_keys=True))
    except Exception as err:
        raise RelaxTuneError(f"the record's target {config!r} is not a TVM target "
                             f"({error_line(err)})") \
            from None


_KNOWN_KINDS: dict[str, bool] = {}


def _is_instruction_kind(name: str) -> bool:
    known = _KNOWN_KINDS.get(name)
    if known is None:
        try:
            InstructionKind.get(name)
            known = True
        except Exception:  # AttributeError "... is not registered"
            known = False
        _KNOWN_KINDS[name] = known
    return known


def check_trace_json(obj: Any) -> None:
    """Cheap shape check of a JSON trace ``[insts, decisions]`` without replaying it.

    Each instruction must be ``[kind, inputs, attrs, outputs]`` with a registered kind; each
    decision ``[inst_index, value]`` with an index into ``insts``. Raise RelaxTuneError otherwise.
    """
    if not (type(obj) is list and len(obj) == 2
            and type(obj[0]) is list and type(obj[1]) is list):
        raise RelaxTuneError("a trace must be [instructions, decisions]")
    insts, decisions = obj
    for pos, inst in enumerate(insts):
        if type(inst) is not list or len(inst) != 4:
            raise RelaxTuneError(f"trace instruction {pos} is not [kind, inputs, attrs, outputs]")
        kind, inputs, attrs, outputs = inst
        if type(inputs) is not list or type(attrs) is not list or type(outputs) is not list \
                or type(kind) is not str:
            raise RelaxTuneError(f"trace instruction {pos} is not [kind, inputs, attrs, outputs]")
        if not _is_instruction_kind(kind):
            raise RelaxTuneError(f"trace instruction {pos} has unknown kind {kind!r}")
    check_decisions_json(decisions, len(insts))


def check_decisions_json(decisions: Any, n_insts: int) -> None:
    """Each decision must be ``[inst_index, value]`` with an index below ``n_insts``."""
    if type(decisions) is not list:
        raise RelaxTuneError("a trace must be [instructions, decisions]")
    for decision in decisions:
        if not (type(decision) is list and len(decision) == 2
                and type(decision[0]) is int and 0 <= decision[0] < n_insts):
            raise RelaxTuneError(f"trace decision {str(decision)[:60]} does not name an "
                                 "instruction of the trace")


def _clean_run_secs(run_secs: Any) -> list[float] | None:
    if run_secs is None:
        return None
    if isinstance(run_secs, (str, bytes)) or not hasattr(run_secs, "__iter__"):
        raise RelaxTuneError(f"run_secs must be a list of seconds or None, not {run_secs!r}")
    out = []
    for sec in run_secs:
        if isinstance(sec, bool):
            raise RelaxTuneError(f"run_secs holds a bool ({sec!r})")
        value = float(getattr(sec, "value", sec))
        if math.isfinite(value) and value < MIN_RUN_SECS:
            raise RelaxTuneError(f"run_secs holds {value!r}: no kernel runs in that time (a "
                                 f"time is at least {MIN_RUN_SECS:g} s; a failed run is "
                                 f"[{FAILED_RUN_SECS:g}])")
        out.append(value if math.isfinite(value) else FAILED_RUN_SECS)
    return out


def measured_run_secs(run_secs: Any) -> list[float] | None:
    """``run_secs`` from a measurement as a record stores them: a time no kernel can take
    (below ``MIN_RUN_SECS``, a broken timer) marks the candidate failed (``[1e10]``) instead of
    stopping the session."""
    try:
        return _clean_run_secs(run_secs)
    except RelaxTuneError as err:
        logging.getLogger("relax_tune.database").warning("a measurement is recorded as failed: "
                                                         "%s", err)
        return [FAILED_RUN_SECS]


def _clean_args_info(args_info: Any) -> list | None:
    """``args_info`` as MetaSchedule's JSON form ``[["TENSOR", dtype, shape], ...]`` (or None).

    Items already in that form are kept; an ArgInfo-like object (anything with ``as_json()``,
    such as MetaSchedule's ``TensorInfo``) is converted with it; anything else raises
    RelaxTuneError."""
    if args_info is None:
        return None
    if type(args_info) is list and all(type(arg) is list for arg in args_info):
        return args_info  # the common case (read from a file, or made by relax_tune)
    if isinstance(args_info, (str, bytes, dict)) or not hasattr(args_info, "__iter__"):
        raise RelaxTuneError(f"args_info must be a list of argument descriptions "
                             f"([\"TENSOR\", dtype, shape] or ArgInfo objects) or None, not "
                             f"{str(args_info)[:60]!r}")
    out = []
    for pos, arg in enumerate(args_info):
        as_json = getattr(arg, "as_json", None)
        try:
            if callable(as_json):
                value = to_plain(as_json())
            elif isinstance(arg, (str, bytes, dict)) or not hasattr(arg, "__iter__"):
                raise TypeError(f"a {type(arg).__name__}")
            else:
                value = to_plain(arg)
        except Exception as err:  # as_json() or the conversion failed: say which argument
            raise RelaxTuneError(
                f"args_info[{pos}] ({str(arg)[:60]}) is not an argument description "
                f"([\"TENSOR\", dtype, shape] or an ArgInfo with as_json()): {err}") from None
        if not isinstance(value, list):
            raise RelaxTuneError(f"args_info[{pos}] ({str(arg)[:60]}) is not an argument "
                                 "description: its JSON form is not a list")
        out.append(value)
    return out


class TuningRecord:
    """One measured candidate: a schedule trace for a workload, its run times and context.

    ``trace_json`` (the plain-JSON trace, ``utils.trace_to_json`` form) is the stored truth;
    ``trace`` replays it lazily on ``workload.mod``. ``run_secs`` is None or a list of seconds;
    non-finite times become ``FAILED_RUN_SECS``, which marks a failed build or run; a time
    below ``MIN_RUN_SECS`` (zero, negative) raises RelaxTuneError.
    ``target`` may be given as a Target, a target string or dict, or None (matches any target).
    A ``tvm.s_tir.Trace`` is accepted in place of ``trace_json`` and converted; so are
    ArgInfo objects (anything with ``as_json()``, such as MetaSchedule's ``TensorInfo``) in
    ``args_info``, which is stored as ``[["TENSOR", dtype, shape], ...]``.
    """

    __slots__ = ("trace_json", "workload", "run_secs", "args_info",
                 "_target", "_target_config", "_trace", "_trace_error")

    def __init__(self, trace_json: list | Trace, workload: Workload,
                 run_secs: list[float] | None = None,
                 target: tvm.target.Target | dict | str | None = None,
                 args_info: list | None = None) -> None:
        self._trace: Trace | None = None
        self._trace_error: str | None = None
        if isinstance(trace_json, Trace):
            self._trace = trace_json
            trace_json = trace_to_json(trace_json)
        self.trace_json: list = trace_json
        self.workload = workload
        self.run_secs = _clean_run_secs(run_secs)
        self.args_info = _clean_args_info(args_info)
        self._target: tvm.target.Target | None
        self._target_config: dict | None
        if target is None:
            self._target, self._target_config = None, None
        elif isinstance(target, tvm.target.Target):
            self._target, self._target_config = target, target_config(target)
        elif isinstance(target, dict):
            self._target, self._target_config = target_from_config(target), target
        elif isinstance(target, str):
            self._target = parse_target(target)
            self._target_config = target_config(self._target)
        else:
            raise RelaxTuneError(f"{target!r} (a {type(target).__name__}) is not a TVM target")

    def __repr__(self) -> str:
        target = self._target_config.get("kind") if self._target_config else None
        return (f"TuningRecord(workload={self.workload.shash}, run_secs={self.run_secs}, "
                f"target={target!r}, insts={len(self.trace_json[0]) if self.trace_json else 0})")

    @property
    def target(self) -> tvm.target.Target | None:
        """The target the record was measured on, or None."""
        return self._target

    @property
    def target_config(self) -> dict | None:
        """The target as the JSON dict stored on disk, or None."""
        return self._target_config

    @property
    def mean_run_secs(self) -> float:
        """Mean of ``run_secs``; ``FAILED_RUN_SECS`` when there are none."""
        if not self.run_secs:
            return FAILED_RUN_SECS
        return sum(self.run_secs) / len(self.run_secs)

    @property
    def is_valid(self) -> bool:
        """True for a successful measurement: run times present and below ``FAILED_RUN_SECS``."""
        return bool(self.run_secs) and self.mean_run_secs < FAILED_RUN_SECS

    @property
    def trace(self) -> Trace:
        """The trace as a ``tvm.s_tir.Trace``, replayed once on ``workload.mod`` and cached.

        Raises RelaxTuneError (naming the workload) when the stored trace does not replay."""
        if self._trace is None:
            if self._trace_error is None:
                try:
                    self._trace = schedule_from_json(self.workload.mod, self.trace_json).trace
                except Exception as err:  # ScheduleError, TVMError, ValueError, ...
                    self._trace_error = _first_line(err)
            if self._trace is None:
                raise RelaxTuneError(
                    f"the trace of a record of workload {self.workload.shash} does not replay on "
                    f"its module: {self._trace_error}")
        return self._trace

    def check_trace(self) -> str | None:
        """None when the trace replays on the workload's module, else why not (computed once;
        the first failure is logged as a warning naming the workload)."""
        if self._trace is None and self._trace_error is None:
            try:
                self.trace
            except RelaxTuneError as err:
                logging.getLogger("relax_tune.database").warning("skipping a record: %s", err)
        return self._trace_error

    def as_schedule(self, mod: tvm.IRModule | None = None, seed: int | None = None) -> Schedule:
        """Replay the trace on a fresh traced Schedule of ``mod`` (default: the workload's).

        Raises RelaxTuneError naming the workload when the trace does not apply."""
        try:
            return schedule_from_json(self.workload.mod if mod is None else mod,
                                      self.trace_json, seed=seed)
        except Exception as err:
            raise RelaxTuneError(
                f"the trace of a record of workload {self.workload.shash} does not replay"
                f"{' on its module' if mod is None else ''}: {_first_line(err)}") from None

    def as_json(self) -> list:
        """``[trace_json, run_secs, target_config, args_info]`` (MetaSchedule's record form)."""
        return [self.trace_json, self.run_secs, self._target_config, self.args_info]

    @staticmethod
    def from_json(obj: Any, workload: Workload, insts_checked: bool = False) -> TuningRecord:
        """Parse a record's JSON value for ``workload`` without replaying its trace.

        Its run times must be ones a kernel can take (``validate.check_run_secs``). The
        trace's shape is checked (see ``check_trace_json``; with ``insts_checked`` only
        its decisions, for an instruction list already checked); a malformed value raises
        RelaxTuneError saying what is wrong with it."""
        if not (isinstance(obj, list) and len(obj) == 4):
            raise RelaxTuneError("a tuning record must be [trace, run_secs, target, args_info]")
        trace_json, run_secs, target, args_info = obj
        if insts_checked:
            check_decisions_json(trace_json[1], len(trace_json[0]))
        else:
            check_trace_json(trace_json)
        if target is not None and not isinstance(target, dict):
            raise RelaxTuneError(f"the record's target {str(target)[:60]} is not a JSON object")
        if args_info is not None and not isinstance(args_info, list):
            raise RelaxTuneError(f"the record's args_info {str(args_info)[:60]} is not a list")
        check_run_secs(run_secs)
        try:
            return TuningRecord(trace_json, workload, run_secs, target, args_info)
        except (TypeError, ValueError) as err:
            if isinstance(err, RelaxTuneError):
                raise
            raise RelaxTuneError(f"bad tuning record ({err})") from None


def candidate_key(trace_json: list) -> str:
    """A record's identity: a stable digest of its trace's instructions and decisions (the
    same schedule gives the same key in every process; it hashes the canonical JSON text)."""
    text = json.dumps(trace_json, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def is_baseline(record_or_trace: TuningRecord | list | Trace | Schedule | None) -> bool:
    """True when ``record_or_trace`` is a task's baseline: the untuned function, a schedule
    with no instructions (``BASELINE_TRACE``).

    Accepts a ``TuningRecord``, a plain-JSON trace (``[insts, decisions]``), a
    ``tvm.s_tir.Trace`` or a ``Schedule``. This is the one place that recognises the
    baseline; everything else (tuning, reports, ``ApplyDatabase``, the database tools, the
    searches' warm start) asks it."""
    if isinstance(record_or_trace, TuningRecord):
        record_or_trace = record_or_trace.trace_json
    elif isinstance(record_or_trace, Schedule):
        record_or_trace = record_or_trace.trace
    if isinstance(record_or_trace, Trace):
        return len(record_or_trace.insts) == 0
    return not record_or_trace or not record_or_trace[0]


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}".strip()
