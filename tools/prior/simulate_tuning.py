"""Tuning sessions replayed on measured corpora: which cost model and adaptation finds fast
candidates in fewest trials, without timing anything.

    python -m tools.prior.simulate_tuning                       # shipped prior vs fresh
    python -m tools.prior.simulate_tuning --strategies blend finetune blend:batch=4 \\
        --model /tmp/prior --seeds 4 --corpus tools/prior/corpus_tables/*.npz

Each held-out task of the corpora (``--split``; tasks of at least ``--min-candidates`` valid
candidates) is a universe: its measured candidates. A strategy tunes it as the tuner does, in
batches: the cost model scores the candidates not yet taken, the batch is the best-scored
ones (an ``eps`` share picked at random; none in the prior's first batch, as in
``EvolutionarySearch``'s first ranked call), its candidates are "measured" by looking up their
recorded seconds, and the model learns them. Printed per strategy: after each budget, the
best found over the universe's best (1.0: found it), geometric mean over the tasks (the
mean over ``--seeds`` sessions per task) and the worst task; then every task's figure.

A strategy is ``NAME[:option=value...]``: NAME one of ``fresh`` (``XGBModel``, what
``cost_model="xgb-fresh"`` does; random scores until trained), ``prior`` (the pre-trained
model alone), ``blend``, ``finetune`` (``PriorXGBModel``'s adaptations); options ``batch``
(candidates per batch, default 8), ``eps`` (random share of later batches, default 0.1),
``eps1`` (of the first batch, default 0), ``temp`` (``blend_temperature``), ``rounds``
(``finetune_rounds``).

What it can and cannot say. The same universe for every strategy and no timing noise, so
small differences between strategies show (the tuner's own runs differ by up to 16%
between identical invocations on 2 cores). But the universe is a corpus task's candidates:
found by a 256-trial search, so good candidates are far denser than in the search's first
pool, and 64 trials take a quarter of it; absolute figures flatter every strategy and
large budgets favour random picks. Compare strategies with each other, not with the tuning
verdict of ``evaluate_prior.py`` (which times real kernels).
"""

from __future__ import annotations

import argparse
import glob
import os
from dataclasses import dataclass, field

import numpy as np

from relax_tune.cost_model import XGBModel
from relax_tune.cost_model.features import FEATURE_VERSION
from relax_tune.utils import FAILED_RUN_SECS

from tools.prior.corpus import TaskData, load_corpus, reference_rows
from tools.prior.evaluate_prior import prior_model

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = sorted(glob.glob(os.path.join(HERE, "corpus_tables", "*.npz")))
BUDGETS = (8, 16, 32, 64)
MODELS = ("fresh", "prior", "blend", "finetune")
_OPTIONS = {"batch": int, "eps": float, "eps1": float, "temp": float, "rounds": int}
_FAILED = FAILED_RUN_SECS * 0.5  # corpus seconds at or above this are failures


@dataclass
class Strategy:
    """A cost model and how batches are picked (module docstring: ``NAME[:option=value]``)."""

    model: str
    batch: int = 8
    eps: float = 0.1
    eps1: float = 0.0
    temp: float | None = None
    rounds: int | None = None
    spec: str = field(default="", compare=False)

    @classmethod
    def parse(cls, spec: str) -> "Strategy":
        """The strategy ``spec`` names; ValueError naming what is wrong."""
        name, *opts = spec.split(":")
        if name not in MODELS:
            raise ValueError(f"strategy {spec!r}: model must be one of {MODELS}, not {name!r}")
        kw = {}
        for opt in opts:
            key, _, value = opt.partition("=")
            if key not in _OPTIONS or not value:
                raise ValueError(f"strategy {spec!r}: option {opt!r} is not one of "
                                 f"{', '.join(k + '=VALUE' for k in _OPTIONS)}")
            kw[key] = _OPTIONS[key](value)
        if kw.get("batch", 8) < 1:
            raise ValueError(f"strategy {spec!r}: batch must be at least 1")
        return cls(model=name, spec=spec, **kw)

    def make_model(self, seed: int, model_dir: str | None = None):
        """A fresh cost model of this strategy."""
        if self.model == "fresh":
            return XGBModel(seed=seed)
        opts = {"adapt": "none" if self.model == "prior" else self.model, "seed": seed}
        if self.temp is not None:
            opts["blend_temperature"] = self.temp
        if self.rounds is not None:
            opts["finetune_rounds"] = self.rounds
        return prior_model(model_dir, **opts)


def simulate(task: TaskData, strategy: Strategy, seed: int, budgets=BUDGETS,
             model_dir: str | None = None) -> list[float]:
    """One session on ``task``'s universe: the best found after each budget over the
    universe's best valid candidate."""
    model = strategy.make_model(seed, model_dir)
    rng = np.random.default_rng(seed)
    name = task.name
    if hasattr(model, "set_facts"):
        model.set_facts(name, task.facts)  # the machine the universe was measured on
        model.transfer(name, reference_rows(task))  # the reference the first pool sets
    left = np.ones(len(task.secs), dtype=bool)
    taken: list[int] = []
    while len(taken) < max(budgets) and left.any():
        idx = np.flatnonzero(left)
        # an untrained fresh model scores at random
        scores = np.asarray(model.predict_features(name, task.features[idx]), np.float64)
        ranked = idx[np.argsort(-(scores + rng.random(len(idx)) * 1e-9))]  # ties at random
        eps = strategy.eps1 if not taken else strategy.eps
        n = min(strategy.batch, len(idx))
        n_random = min(n, int(np.floor(eps * n + rng.random())))
        pick = list(ranked[:n - n_random])
        rest = ranked[n - n_random:]
        if n_random:
            pick += list(rng.choice(rest, n_random, replace=False))
        left[pick] = False
        taken += pick
        model.update_features(name, task.features[pick], list(task.secs[pick]))
    best = task.secs[task.secs < _FAILED].min()
    return [float(task.secs[taken[:k]].min() / best) for k in budgets]


def compare(tasks: list[TaskData], strategies: list[Strategy], seeds, budgets=BUDGETS,
            model_dir: str | None = None) -> dict[str, np.ndarray]:
    """Per strategy spec, a ``tasks x budgets`` array: best found over best, mean over seeds."""
    return {s.spec: np.asarray([np.mean([simulate(t, s, seed, budgets, model_dir)
                                         for seed in seeds], axis=0) for t in tasks])
            for s in strategies}


def simulated_tasks(corpus, split: str = "heldout", min_candidates: int = 100) -> list[TaskData]:
    """The corpora's tasks of ``split`` ("all": every task) with enough valid candidates."""
    return [t for t in load_corpus(corpus, FEATURE_VERSION)
            if split in ("all", t.split) and (t.secs < _FAILED).sum() >= min_candidates]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", nargs="+", default=DEFAULT_CORPUS,
                        help="corpus tables or directories (default: tools/prior/corpus_tables)")
    parser.add_argument("--strategies", nargs="+", default=["fresh", "prior", "blend"])
    parser.add_argument("--model", default=None,
                        help="a train_prior.py --out directory (default: the shipped model)")
    parser.add_argument("--seeds", type=int, default=4, help="sessions per task and strategy")
    parser.add_argument("--split", default="heldout", choices=("heldout", "train", "all"))
    parser.add_argument("--min-candidates", type=int, default=100)
    parser.add_argument("--budgets", nargs="+", type=int, default=list(BUDGETS))
    args = parser.parse_args()
    try:
        strategies = [Strategy.parse(s) for s in args.strategies]
    except ValueError as err:
        parser.error(str(err))
    tasks = simulated_tasks(args.corpus, args.split, args.min_candidates)
    if not tasks:
        parser.error(f"no {args.split} task of {args.min_candidates}+ valid candidates in "
                     f"{args.corpus}")
    budgets = sorted(args.budgets)
    seeds = range(1, args.seeds + 1)
    print(f"{len(tasks)} tasks, {args.seeds} sessions each; best found over the universe's "
          f"best, geomean over tasks (worst task)")
    results = compare(tasks, strategies, seeds, budgets, args.model)
    for spec, res in results.items():
        gm = np.exp(np.log(res).mean(axis=0))
        cells = "  ".join(f"@{k} {g:.3f} ({w:.2f})" for k, g, w in zip(budgets, gm, res.max(0)))
        print(f"{spec:26s} {cells}")
    col = min(1, len(budgets) - 1)
    print(f"\nper task, @{budgets[col]}: " + "  ".join(results))
    for i, t in enumerate(tasks):
        print(f"{t.name[:60]:60s} " + "  ".join(f"{r[i, col]:.2f}" for r in results.values()))


if __name__ == "__main__":
    main()
