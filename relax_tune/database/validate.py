"""What makes a record believable: run times a kernel can take, and arguments that are its
workload's. Checked when a record is read from a file and when one is committed, so that an
impossible time never becomes a best schedule and a record never describes another
workload than the one it is filed under (a workload file emptied or cut short shifts the
indices records refer to).

A failed candidate is recorded with ``run_secs [1e10]`` (``FAILED_RUN_SECS``): finite,
positive, valid here, never applied.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import tvm

from ..utils import RelaxTuneError, args_info

MIN_RUN_SECS = 1e-9
"""No kernel call takes less than a nanosecond: a shorter time is a broken timer or an edited
file, not a measurement."""


def check_run_secs(run_secs: Any) -> None:
    """RelaxTuneError unless ``run_secs`` (as read from a file) is None or a non-empty list
    of finite numbers of seconds, each at least ``MIN_RUN_SECS``."""
    if run_secs is None:
        return
    if type(run_secs) is not list or not run_secs:
        raise RelaxTuneError(f"run_secs {str(run_secs)[:60]} is not a list of seconds")
    for sec in run_secs:
        if isinstance(sec, bool) or not isinstance(sec, numbers.Real):
            raise RelaxTuneError(f"run_secs holds {str(sec)[:40]!r}, not a number of seconds")
        if not math.isfinite(sec) or sec < MIN_RUN_SECS:
            raise RelaxTuneError(f"run_secs holds {sec!r}: no kernel runs in that time "
                                 f"(a time must be finite and at least {MIN_RUN_SECS:g} s)")


def workload_args(mod: tvm.IRModule) -> list | None:
    """The ``args_info`` a record of the one-function workload ``mod`` must carry, with None
    for each symbolic dimension (any size matches); None when ``mod`` is not one PrimFunc."""
    funcs = [f for _, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    if len(funcs) != 1:
        return None
    return args_info(tvm.IRModule({"main": funcs[0]}), symbolic_as_none=True)


def _matches(arg: Any, want: list) -> bool:
    if type(arg) is not list or len(arg) != len(want) or arg[:2] != want[:2]:
        return False
    if want[0] != "TENSOR":
        return True
    shape = arg[2]
    return type(shape) is list and len(shape) == len(want[2]) and all(
        w is None or (type(d) is int and d == w) for d, w in zip(shape, want[2]))


def check_args_info(args_info: Any, expected: list | None) -> None:
    """RelaxTuneError unless ``args_info`` (None: not recorded, accepted) describes the
    arguments ``expected`` (``workload_args`` of the record's workload; None: unknown,
    accepted): same count, kinds, dtypes and static sizes."""
    if args_info is None or expected is None or args_info == expected:
        return
    if type(args_info) is list and len(args_info) == len(expected) and all(
            _matches(arg, want) for arg, want in zip(args_info, expected)):
        return
    raise RelaxTuneError(f"its arguments {_short(args_info)} are not its workload's "
                         f"{_short(expected)}: a record of another workload (was the "
                         "workload file emptied or cut short?)")


def _short(args: Any) -> str:
    text = str([a[1:] if type(a) is list else a for a in args]) if type(args) is list \
        else str(args)
    return text if len(text) <= 80 else text[:77] + "..."
