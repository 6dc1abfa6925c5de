"""The two extension points of a design space: schedule rules and postprocessors."""

from __future__ import annotations

from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV


class ScheduleRule:
    """One job of a design space, applied to one block at a time.

    ``apply`` gets a traced schedule and a block of it and returns the schedules it turns
    that into: ``[sch]`` (possibly changed in place) when the rule does not branch, several
    copies when it offers alternatives (each becomes its own sketch), never an empty list.
    Choices that differ per candidate are made with sampling instructions
    (``sch.sample_perfect_tile``, ``sch.sample_categorical``...), so that replaying the trace
    with its decisions removed draws a new candidate. A rule must leave blocks it does not
    handle untouched and must not raise for them.
    """

    name = "rule"

    def apply(self, sch: Schedule, block: SBlockRV) -> list[Schedule]:
        """Apply the rule to ``block`` of ``sch``; return the resulting schedules."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FunctionRule:
    """A schedule for a whole function of a shape it recognises (a fused attention), made
    before any block rule runs: when ``sketches`` returns schedules, they are the
    function's sketches and the block rules do not run; ``[]`` leaves the function to them.
    Sampling as for ``ScheduleRule``; must not raise."""

    name = "function_rule"

    def sketches(self, sch: Schedule) -> list[Schedule]:
        """The sketches for the function of ``sch`` (unchanged), or ``[]``."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Postproc:
    """A deterministic rewrite applied to each sampled candidate after replaying its sketch
    (after ``sch.enter_postproc()``): it turns sketch annotations into concrete loop kinds
    that depend on the sampled loop extents. ``apply`` returns False when the candidate
    cannot be completed (it is then dropped); it may raise ScheduleError, which counts the
    same."""

    name = "postproc"

    def apply(self, sch: Schedule) -> bool:
        """Rewrite ``sch`` in place; False when the candidate must be dropped."""
        raise NotImplementedError

    def precheck(self, sch: Schedule) -> bool:
        """A cheap look at the replayed sketch before any postprocessor runs: False when
        ``apply`` is certain to reject it whatever the others do, so the candidate is
        dropped before the expensive rewrites. The default accepts everything."""
        return True

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
