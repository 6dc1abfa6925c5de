"""Design spaces: schedule rules that turn a TIR workload into sketches (traces with
sampling instructions), postprocessors that complete each sampled candidate, and the
checks that keep invalid candidates from being built.

The entry points the tuner uses::

    sketches = generate_design_space(mod, target)        # list[Trace]
    space = space_for_target(target)                     # rules + postprocs for the target
    out = space.replay(mod, without_decisions(sketches[0]), seed=1234)
    out.sch, out.error                                   # a checked candidate, or why not
    check_schedule(out.sch, target)                      # None when it looks valid
"""

from __future__ import annotations

import logging

import tvm
from tvm.s_tir import Schedule, Trace

from . import analysis, cpu, gpu
from .generator import (Replayed, SpaceGenerator, empty_trace, register_space, sketch_part,
                        space_for_target, without_decisions)
from .inline import AutoInline
from .cpu.multi_level_tiling import LimitRegisterTile, MultiLevelTiling
from .parallel_vectorize_unroll import ParallelVectorizeUnroll, RewriteParallelVectorizeUnroll
from .params import TargetParams, target_params
from .postproc import RewriteReductionBlock
from .rule import Postproc, ScheduleRule
from .verify import check_decision, sampling_instructions, validate_decisions
from .verify import check_schedule as _check_schedule

logger = logging.getLogger("relax_tune.space")


def generate_design_space(mod: tvm.IRModule, target: tvm.target.Target) -> list[Trace]:
    """Sketches for a normalised single-function workload ("main"): traces over
    ``Schedule(mod)`` whose sampling instructions get fresh decisions when replayed with
    decisions removed (see :func:`without_decisions`). Each sampled candidate must then be
    completed by the target's postprocessors (:meth:`SpaceGenerator.replay` does both).
    Never raises for a function it cannot schedule: then returns ``[the empty trace]`` (the
    function as it is), logging why at debug level."""
    try:
        space = space_for_target(target)
    except Exception as err:
        logger.debug("no design space for target %s: %s", target, err)
        return [empty_trace()]
    return space.generate_design_space(mod)


def check_schedule(sch: Schedule, target: tvm.target.Target) -> str | None:
    """None when the scheduled candidate looks valid to build and run on ``target``, else
    the reason (postprocessing not applied, vector loops past the target's lanes, nested
    parallel loops, a parallel reduction, thread bindings on a CPU)."""
    return _check_schedule(sch, target)


__all__ = [
    "AutoInline", "LimitRegisterTile", "MultiLevelTiling", "ParallelVectorizeUnroll", "Postproc", "Replayed",
    "RewriteParallelVectorizeUnroll", "RewriteReductionBlock", "ScheduleRule",
    "SpaceGenerator", "TargetParams", "analysis", "check_decision",
    "check_schedule", "cpu", "gpu", "empty_trace", "generate_design_space", "register_space",
    "sampling_instructions", "sketch_part", "space_for_target", "target_params",
    "validate_decisions", "without_decisions",
]
