"""Head-to-head timing: a candidate about to become its task's best is timed again, in
alternation with a reference kernel of the task (an earlier best), before it is recorded.

Why: the speed of a shared machine drifts (a neighbour on the sibling hyperthread, the clock),
and the drift hits kernels unevenly. A candidate timed in a fast spell then looks better than a
better one timed in a slow spell, and the more candidates a run measures, the surer its
recorded best is such a lucky measurement (the winner's curse). Timing challenger and reference
alternately, round by round, puts both in the same spell; the mean of the per-round ratios
decides (the database ranks records by their mean). Within a round each side counts its fastest
repeat: interference from other work only ever adds time, and one disturbed repeat (a CI
neighbour, a spinning thread) would otherwise swing a whole round's ratio. Measurements:
docs/design/head-to-head.md.

The challenger's record is written in the reference's frame: ``reference_secs * ratio`` for
each round, so the database keeps ranking every record of the task on one scale.

All rounds run through ``Runner.run_on_one_device``: one device, one kernel at a time (a
remote runner would otherwise time the two sides of a round on different servers at once).
When a challenge happens, and what is recorded then, the measurement protocol decides.
"""

from __future__ import annotations

from typing import Any

from .base import Runner

DEFAULT_ROUNDS = 3


def head_to_head(runner: Runner, reference: str, challenger: str, args_info: list,
                 target: Any, rounds: int = DEFAULT_ROUNDS) -> list[float] | None:
    """Time ``reference`` and ``challenger`` (artifact paths) alternately, ``rounds`` pairs
    (the order flips every round so neither always goes first), and return the per-round
    ratios challenger / reference (the fastest repeat of each), or None when either failed
    to run in some round."""
    artifacts: list[str | None] = []
    for k in range(rounds):
        artifacts += [reference, challenger] if k % 2 == 0 else [challenger, reference]
    results = runner.run_on_one_device(artifacts, args_info, target)
    if len(results) != len(artifacts) or not all(r.ok for r in results):
        return None
    ratios = []
    for k in range(rounds):
        first, second = results[2 * k], results[2 * k + 1]
        ref, cha = (first, second) if k % 2 == 0 else (second, first)
        ratios.append(min(cha.run_secs) / min(ref.run_secs))
    return ratios
