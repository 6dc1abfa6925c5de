"""What a task's baseline is on a target: the program its baseline record stands for.

A baseline record (``database.BASELINE_TRACE``, the empty trace) means "no tuned schedule":
what the compiled model runs for the function when no tuned record beats it. That is what
the baseline must be timed as, and what the correctness check compares candidates with:

- on a CPU (``llvm``), the function as it is: TVM compiles an unscheduled function;
- on a GPU (``cuda``), the target's default schedule, ``tvm.s_tir.dlight``'s rules
  (``space.gpu.default_schedule_pass``): an unbound function is no GPU kernel (TVM compiles
  it to host code), and the "relax_tune" pipeline gives every function without a tuned
  record the same dlight schedule after ``ApplyDatabase``.

So on every target a tuned schedule is applied only when it beat, and computes what, the
program the model would run without it ("never slower", "never wrong").
"""

from __future__ import annotations

import tvm

from ..utils import RelaxTuneError, parse_target


def uses_default_schedule(target: tvm.target.Target | str | dict) -> bool:
    """True when ``target``'s baseline is its default schedule (a GPU target), not the
    function as it is."""
    return "gpu" in parse_target(target).keys


def baseline_module(mod: tvm.IRModule, target: tvm.target.Target | str | dict
                    ) -> tvm.IRModule:
    """The program a task's baseline record stands for on ``target`` (see the module doc):
    ``mod`` itself on a CPU; on a GPU ``mod`` with dlight's default schedules applied.

    Raises RelaxTuneError when no default rule schedules a function of ``mod`` on a GPU
    target (it would run as host code on device memory); the builder records that as the
    baseline's build error."""
    target = parse_target(target)
    if not uses_default_schedule(target):
        return mod
    from ..space.gpu import default_schedule_pass  # GPU targets only

    with target:  # dlight replaces the functions of the module it is given: give it a copy
        scheduled = default_schedule_pass()(mod.clone())
    unbound = [gv.name_hint for gv, func in scheduled.functions.items()
               if isinstance(func, tvm.tirx.PrimFunc)
               and not (func.attrs is not None
                        and bool(func.attrs.get("tirx.is_scheduled", False)))]
    if unbound:
        raise RelaxTuneError(f"no default {target.kind.name} schedule (dlight) applies to "
                             f"{', '.join(unbound)}: it has no baseline on this target")
    return scheduled
