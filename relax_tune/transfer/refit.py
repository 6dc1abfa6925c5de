"""Replaying a schedule of one workload on an alike workload of other shapes.

A trace's tile sizes (``SamplePerfectTile`` decisions) multiply to its own loops' extents,
so they do not fit another shape. :func:`refit_trace` replays the trace on the new workload
and fits each tiling as it goes: from the innermost factor out, each keeps the largest part
of the source's factor that divides what is left of the new extent, and the outermost takes
the rest. The inner tiles (registers, vector lanes, cache blocks) are what a tuned schedule
found and what carries over between shapes; the outer ones are mostly parallel work and
follow the shape. A compute location that does not exist in the new loop nest is sampled
afresh on a second try. The result goes through the design space's postprocessing and
checks like any candidate.
"""

from __future__ import annotations

import math

import tvm
from tvm.s_tir import Schedule, Trace

from ..space import sketch_part
from ..utils import error_line


def fit_tile(factors: list[int], extent: int) -> list[int]:
    """Tile sizes for a loop of ``extent`` shaped like ``factors`` (outermost first): the
    inner ones keep what of the source's divides what is left, the outermost the rest."""
    out = [1] * len(factors)
    rest = extent
    for i in range(len(factors) - 1, 0, -1):
        out[i] = math.gcd(int(factors[i]), rest)
        rest //= out[i]
    out[0] = rest
    return out


def _apply(sketch: Trace, mod: tvm.IRModule, keep_locations: bool) -> Schedule:
    sch = Schedule(mod, seed=1, error_render_level="none")

    def provide(inst, inputs, _attrs, decision):
        name = inst.kind.name
        if name == "SamplePerfectTile" and decision is not None:
            extent = sch.get(inputs[0]).extent
            if isinstance(extent, tvm.tirx.IntImm):
                return fit_tile([int(x) for x in decision], int(extent))
        if name == "SampleComputeLocation" and not keep_locations:
            return None
        return decision

    sketch.apply_to_schedule(sch, remove_postproc=True, decision_provider=provide)
    return sch


def refit_trace(source: Schedule, mod: tvm.IRModule) -> tuple[Trace | None, str]:
    """``source``'s trace (a schedule of an alike workload) replayed on ``mod`` with its
    tiles fitted: the new trace's sketch part with its decisions, or None and why not."""
    sketch = sketch_part(source.trace)
    error = ""
    for keep_locations in (True, False):
        try:
            return sketch_part(_apply(sketch, mod, keep_locations).trace), ""
        except Exception as err:  # noqa: BLE001 - a trace that does not carry over
            error = error_line(err, with_type=True)
    return None, f"does not replay on this workload: {error}"
