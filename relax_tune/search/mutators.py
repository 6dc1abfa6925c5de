"""Mutators: small changes to a candidate's decisions that keep them valid.

A mutator takes the sketch part of a candidate's trace (``space.sketch_part``: decisions
kept, postprocessing stripped) and returns a new trace with one choice changed, or None when
it has nothing to change. Replaying the result (``SpaceGenerator.replay``) re-runs the
postprocessors, so a changed tile or unroll step gives a complete, checked candidate.

- ``MutateTileSize``: moves a factor between two levels of one ``SamplePerfectTile``
  (the product stays the loop extent; ``max_innermost_factor`` is respected).
- ``MutateUnroll``: another step for a ``SampleCategorical`` that feeds an unroll annotation.
- ``MutateCategorical``: another choice for any other ``SampleCategorical``.
- ``MutateParallel``: another parallel budget (cores x jobs per core) on the root block's
  ``relax_tune.parallel`` annotation (a literal, or the categorical it was sampled from);
  the postprocessor fuses that many outer iterations.
- ``MutateComputeLocation``: another location for a ``SampleComputeLocation``; locations
  the loop nest does not have are refused by the replay (``validate_decisions``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from tvm import tirx
from tvm.s_tir import Trace
from tvm.s_tir.schedule import Instruction

from ..space import sampling_instructions
from ..space.params import ANN_PARALLEL

logger = logging.getLogger("relax_tune.search")


def _ints(value: Any) -> list[int]:
    return [int(v) for v in value]


def _with_decision(trace: Trace, inst: Any, decision: Any) -> Trace:
    return trace.with_decision(inst, decision, remove_postproc=True)


def _divisors(n: int) -> list[int]:
    return [d for d in range(2, n + 1) if n % d == 0]


class Mutator:
    """Changes one choice of a trace; ``apply`` returns the new trace or None."""

    name = "base"

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        """A copy of ``trace`` with one choice changed, or None when there is none to change."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class MutateTileSize(Mutator):
    """Move a divisor of one tile factor to another level of the same perfect tile.

    Args:
        max_tries: attempts before giving up on a trace (a move can break the innermost limit).
    """

    name = "tile_size"

    def __init__(self, max_tries: int = 16) -> None:
        self.max_tries = max_tries

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        """A trace with one tile decision changed, its product kept."""
        tiles = []
        for inst in sampling_instructions(trace):
            if inst.kind.name != "SamplePerfectTile":
                continue
            dec = trace.get_decision(inst)
            if dec is None:
                continue
            factors = _ints(dec)
            if len(factors) > 1 and any(f > 1 for f in factors):
                tiles.append((inst, factors))
        if not tiles:
            return None
        for _ in range(self.max_tries):
            inst, factors = tiles[int(rng.integers(len(tiles)))]
            max_inner = int(inst.attrs[1]) if len(inst.attrs) > 1 else -1
            src_choices = [i for i, f in enumerate(factors) if f > 1]
            src = src_choices[int(rng.integers(len(src_choices)))]
            dst = int(rng.integers(len(factors) - 1))
            if dst >= src:
                dst += 1
            divs = _divisors(factors[src])
            d = divs[int(rng.integers(len(divs)))]
            new = list(factors)
            new[src] //= d
            new[dst] *= d
            if max_inner > 0 and new[-1] > max_inner:
                continue
            return _with_decision(trace, inst, new)
        return None


def _unroll_categoricals(trace: Trace) -> set[int]:
    """Indices (into ``trace.insts``) of categoricals whose value an unroll annotation uses."""
    insts = list(trace.insts)
    out = set()
    for i, inst in enumerate(insts):
        if inst.kind.name != "SampleCategorical" or not inst.outputs:
            continue
        var = inst.outputs[0]
        for user in insts[i + 1:]:
            if user.kind.name == "Annotate" and "unroll" in str(user.attrs[0]) and \
                    len(user.inputs) > 1 and user.inputs[1].same_as(var):
                out.add(i)
                break
    return out


class _CategoricalBase(Mutator):
    unroll: bool = False

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        """A trace with one categorical decision changed to another index."""
        unroll = _unroll_categoricals(trace)
        insts = list(trace.insts)
        choices = []
        for i, inst in enumerate(insts):
            if inst.kind.name == "EnterPostproc":
                break
            if inst.kind.name != "SampleCategorical" or (i in unroll) != self.unroll:
                continue
            n = len(inst.attrs[0])
            dec = trace.get_decision(inst)
            if n > 1 and dec is not None:
                choices.append((inst, n, int(dec)))
        if not choices:
            return None
        inst, n, cur = choices[int(rng.integers(len(choices)))]
        new = int(rng.integers(n - 1))
        if new >= cur:
            new += 1
        return _with_decision(trace, inst, new)


class MutateUnroll(_CategoricalBase):
    """Another ``pragma_auto_unroll_max_step`` choice (a categorical feeding an unroll
    annotation)."""

    name = "unroll"
    unroll = True


class MutateCategorical(_CategoricalBase):
    """Another choice for a categorical that is not an unroll step."""

    name = "categorical"
    unroll = False


class MutateParallel(Mutator):
    """Another parallel budget on the root block: ``num_cores x j`` jobs for j in ``jobs``.

    Args:
        num_cores: the target's cores.
        jobs: jobs per core to choose from.
    """

    name = "parallel"

    def __init__(self, num_cores: int, jobs: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)) -> None:
        self.num_cores = max(1, int(num_cores))
        self.jobs = tuple(jobs)

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        """A trace whose parallel annotation asks for another number of jobs."""
        insts = list(trace.insts)
        for i, inst in enumerate(insts):
            if inst.kind.name == "EnterPostproc":
                break
            if inst.kind.name != "Annotate" or str(inst.attrs[0]) != ANN_PARALLEL:
                continue
            value = inst.inputs[1]
            if not isinstance(value, (int, tirx.IntImm)):
                # the budget is itself sampled: change that categorical's decision
                return _change_categorical_output(trace, value, rng)
            cur = int(value.value) if isinstance(value, tirx.IntImm) else int(value)
            options = [self.num_cores * j for j in self.jobs if self.num_cores * j != cur]
            if not options:
                return None
            new_value = options[int(rng.integers(len(options)))]
            new_inst = Instruction(inst.kind, [inst.inputs[0], tirx.IntImm("int32", new_value)],
                                   inst.attrs, inst.outputs)
            new_insts = insts[:i] + [new_inst] + insts[i + 1:]
            cut = next((k for k, x in enumerate(new_insts) if x.kind.name == "EnterPostproc"),
                       len(new_insts))
            new_insts = new_insts[:cut]
            decisions = {x: trace.get_decision(x) for x in new_insts
                         if trace.get_decision(x) is not None}
            return Trace(new_insts, decisions)
        return None


def _change_categorical_output(trace: Trace, var: Any, rng: np.random.Generator) -> Trace | None:
    for inst in sampling_instructions(trace):
        if inst.kind.name == "SampleCategorical" and inst.outputs and inst.outputs[0].same_as(var):
            n = len(inst.attrs[0])
            dec = trace.get_decision(inst)
            if n < 2 or dec is None:
                return None
            new = int(rng.integers(n - 1))
            if new >= int(dec):
                new += 1
            return _with_decision(trace, inst, new)
    return None


class MutateComputeLocation(Mutator):
    """Another location (-2 inline, -1 root, k: under loop k) for a compute-location
    sample. The replay refuses a location the loop nest does not have, so only valid
    locations survive.

    Args:
        max_loop: largest loop index tried beyond the current one.
    """

    name = "compute_location"

    def __init__(self, max_loop: int = 3) -> None:
        self.max_loop = max_loop

    def apply(self, trace: Trace, rng: np.random.Generator) -> Trace | None:
        """A trace with one compute location moved."""
        choices = [inst for inst in sampling_instructions(trace)
                   if inst.kind.name == "SampleComputeLocation"
                   and trace.get_decision(inst) is not None]
        if not choices:
            return None
        inst = choices[int(rng.integers(len(choices)))]
        cur = int(trace.get_decision(inst))
        options = [x for x in range(-2, max(cur, 0) + self.max_loop + 1) if x != cur]
        return _with_decision(trace, inst, options[int(rng.integers(len(options)))])


def default_mutators(num_cores: int) -> dict[Mutator, float]:
    """The mutators evolutionary search uses, with their probabilities."""
    return {MutateTileSize(): 0.55, MutateUnroll(): 0.15, MutateParallel(num_cores): 0.1,
            MutateComputeLocation(): 0.1, MutateCategorical(): 0.1}
