"""The space generator: applies schedule rules to a workload to make sketches (traces with
sampling instructions), and turns a sketch plus decisions into a checked candidate."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import tvm
from tvm import tirx
from tvm.s_tir import Schedule, Trace

from ..utils import error_line, replay_schedule
from . import analysis as A
from .params import TargetParams, target_params
from .rule import FunctionRule, Postproc, ScheduleRule
from .verify import check_decision, check_schedule, sampling_instructions, validate_decisions

logger = logging.getLogger("relax_tune.space")

_REPORTED: set[str] = set()


def _report_once(post: Postproc, reason: str) -> None:
    """A postprocessor that raises has a bug (they reject a candidate by returning False;
    none raised on 120 CPU tasks of three models): its candidates are dropped, so say so,
    once per postprocessor and process. Silent, a broken check left 36 of 101 tasks of a
    no-measurement compile unpredicted."""
    if str(post) not in _REPORTED:
        _REPORTED.add(str(post))
        logger.warning("%s; such candidates are dropped (an internal error: please report "
                       "it)", reason)


MAX_SKETCHES = 64
"""Rules that branch multiply sketches; more than this many are cut (first ones kept)."""


def empty_trace() -> Trace:
    """The trace that schedules nothing: replaying it gives the function as it is."""
    return Trace([], {})


def without_decisions(trace: Trace) -> Trace:
    """``trace`` before its postprocessing, with every decision removed, so that a replay
    samples all of them afresh."""
    insts = []
    for inst in trace.insts:
        if inst.kind.name == "EnterPostproc":
            break
        insts.append(inst)
    return Trace(insts, {})


def sketch_part(trace: Trace) -> Trace:
    """``trace`` before its postprocessing, keeping the decisions."""
    insts = []
    decisions = {}
    for inst in trace.insts:
        if inst.kind.name == "EnterPostproc":
            break
        insts.append(inst)
        dec = trace.get_decision(inst)
        if dec is not None:
            decisions[inst] = dec
    return Trace(insts, decisions)


def _main_name(mod: tvm.IRModule) -> str | None:
    names = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)]
    if "main" in names:
        return "main"
    return names[0] if len(names) == 1 else None


@dataclass
class Replayed:
    """What :meth:`SpaceGenerator.replay` made of a trace: the schedule, or why not."""

    sch: Schedule | None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the candidate is valid."""
        return self.sch is not None and self.error is None


class SpaceGenerator:
    """A design space for one target: function rules (a whole function they recognise),
    schedule rules (applied rule by rule, each to every block, consumers first, as
    MetaSchedule's post-order application) and postprocessors.

    Args:
        target: the target the candidates are for.
        rules: the schedule rules, in order.
        postprocs: the postprocessors, in order.
        params: the target's parameters (default: read from ``target``).
        function_rules: tried first, in order; the first that recognises the function
            makes its sketches, and the schedule rules are not applied.
    """

    def __init__(self, target: tvm.target.Target, rules: Sequence[ScheduleRule],
                 postprocs: Sequence[Postproc], params: TargetParams | None = None,
                 function_rules: Sequence[FunctionRule] = ()) -> None:
        self.target = target
        self.params = params or target_params(target)
        self.rules = list(rules)
        self.postprocs = list(postprocs)
        self.function_rules = list(function_rules)

    # -- sketches -------------------------------------------------------------------------

    def generate_design_space(self, mod: tvm.IRModule) -> list[Trace]:
        """Sketches for the single function of ``mod``; ``[empty_trace()]`` when there is
        nothing the rules can schedule (never raises for a function it cannot handle)."""
        try:
            return self._generate(mod)
        except Exception as err:  # never let one odd function stop the tuner
            logger.debug("no design space (%s: %s); using the function as it is",
                         type(err).__name__, err)
            return [empty_trace()]

    def _generate(self, mod: tvm.IRModule) -> list[Trace]:
        if not self.rules:
            logger.debug("no schedule rules for target kind %r: the function stays as it is",
                         self.params.kind)
            return [empty_trace()]
        name = _main_name(mod)
        if name is None:
            logger.debug("no design space: the module does not hold exactly one PrimFunc")
            return [empty_trace()]
        func = mod[name]
        if _has_symbolic_shape(func):
            logger.debug("no design space for %s: symbolic shapes", name)
            return [empty_trace()]
        sch = replay_schedule(mod, seed=None)
        sch.work_on(name)
        blocks = A.collect_blocks(sch, name)
        if len(blocks) <= 1:
            logger.debug("no design space for %s: no blocks to schedule", name)
            return [empty_trace()]
        schedules = self._function_sketches(sch) or self._block_sketches(sch, blocks)
        traces: list[Trace] = []
        seen: set[str] = set()
        for current in schedules:
            trace = current.trace
            text = str(without_decisions(trace))
            if text in seen:
                continue
            seen.add(text)
            traces.append(trace)
        logger.debug("design space of %s: %d sketches", name, len(traces))
        return traces or [empty_trace()]

    def _block_sketches(self, sch: Schedule, blocks: list) -> list[Schedule]:
        """The schedule rules applied rule by rule to every block of ``sch``."""
        schedules = [sch]
        for rule in self.rules:
            next_round: list[Schedule] = []
            for current in schedules:
                next_round.extend(self._apply_rule(current, rule, blocks))
            if len(next_round) > MAX_SKETCHES:
                logger.debug("%s made %d sketches; keeping %d", rule, len(next_round),
                             MAX_SKETCHES)
                next_round = next_round[:MAX_SKETCHES]
            schedules = next_round or schedules
        return schedules

    def _function_sketches(self, sch: Schedule) -> list[Schedule]:
        """The sketches of the first function rule that recognises the function, or []."""
        for rule in self.function_rules:
            try:
                made = rule.sketches(sch)
            except Exception as err:  # a rule bug must not lose the function
                logger.debug("%s failed: %s", rule, err)
                made = []
            if made:
                logger.debug("%s made %d sketches", rule, len(made))
                return made
        return []

    @staticmethod
    def _apply_rule(sch: Schedule, rule: ScheduleRule, blocks: list) -> list[Schedule]:
        """Apply ``rule`` to every block, last block first; branches multiply."""
        done: list[Schedule] = []
        stack: list[tuple[Schedule, int]] = [(sch, len(blocks))]
        while stack:
            current, remaining = stack.pop()
            if remaining == 0:
                done.append(current)
                continue
            block = blocks[remaining - 1]
            if not A.block_exists(current, block):
                stack.append((current, remaining - 1))
                continue
            try:
                outs = rule.apply(current, block) or [current]
            except Exception as err:  # a rule bug must not lose the sketch
                logger.debug("%s failed on a block: %s", rule, err)
                outs = [current]
            for out in reversed(outs):
                stack.append((out, remaining - 1))
        return done

    # -- candidates -----------------------------------------------------------------------

    def apply_postprocs(self, sch: Schedule) -> str | None:
        """Run the postprocessors on ``sch`` (after ``enter_postproc``); None on success,
        else why the candidate must be dropped."""
        for post in self.postprocs:
            try:
                if not post.precheck(sch):
                    return f"{post} rejected the candidate"
            except Exception as err:
                logger.debug("%s precheck failed: %s", post, err)  # apply will decide
        sch.enter_postproc()
        for post in self.postprocs:
            try:
                if not post.apply(sch):
                    return f"{post} rejected the candidate"
            except Exception as err:
                reason = f"{post} failed: {error_line(err, with_type=True)}"
                _report_once(post, reason)
                return reason
        return None

    def replay(self, mod: tvm.IRModule, trace: Trace, seed: int | None = None,
               postprocs: bool = True, check: bool = True) -> Replayed:
        """Replay the sketch part of ``trace`` on a fresh schedule of ``mod``: instructions
        with a decision reuse it (and it must be honoured), the others sample afresh with
        ``seed``. Then postprocess and check. Never raises."""
        sketch = sketch_part(trace)
        for inst in sampling_instructions(sketch):
            reason = check_decision(inst, sketch.get_decision(inst))
            if reason is not None:
                return Replayed(None, reason)
        try:
            sch = replay_schedule(mod, seed)
            sketch.apply_to_schedule(sch, remove_postproc=True)
        except Exception as err:
            return Replayed(None, f"replay failed: {error_line(err, with_type=True)}")
        reason = validate_decisions(sketch, sch.trace)
        if reason is not None:
            return Replayed(None, reason)
        if postprocs and len(sketch.insts) > 0:
            reason = self.apply_postprocs(sch)
            if reason is not None:
                return Replayed(None, reason)
        if check:
            reason = check_schedule(sch, self.target, self.params)
            if reason is not None:
                return Replayed(None, reason)
        return Replayed(sch)


def _has_symbolic_shape(func: tirx.PrimFunc) -> bool:
    for param in func.params:
        for dim in getattr(param, "shape", None) or []:
            if not isinstance(dim, tirx.IntImm):
                return True
    return False


# ------------------------------------------------------------------------------------------
# Per-target registry

SpaceFactory = Callable[[tvm.target.Target, TargetParams], SpaceGenerator]
_SPACES: dict[str, SpaceFactory] = {}


def register_space(kind: str, factory: SpaceFactory) -> None:
    """Make ``factory(target, params)`` the design space for targets of ``kind``."""
    _SPACES[kind] = factory


def space_for_target(target: tvm.target.Target) -> SpaceGenerator:
    """The design space registered for the target's kind; a space without rules (the
    function as it is) for kinds nobody registered."""
    params = target_params(target)
    factory = _SPACES.get(params.kind)
    if factory is None:
        logger.debug("no design space for target kind %r; functions stay as they are",
                     params.kind)
        return SpaceGenerator(target, [], [], params)
    return factory(target, params)
