r"""Train the pre-trained cost model from a corpus (``make_corpus.py``) and ship it.

    python -m tools.prior.train_prior --corpus /work/corpus            # writes the
        # package's relax_tune/cost_model/pretrained/xgb_prior.{ubj,_meta.json}
    python -m tools.prior.train_prior --corpus /work/corpus --out /tmp/prior --seed 2
    python -m tools.prior.train_prior --corpus /work/corpus /work/corpus_models  # several
    python -m tools.prior.train_prior --corpus /work/corpus2 /work/corpus_models /work/corpus_rand
        # the shipped model; --exclude '(resnet18|bert)\.' keeps bench_real_models's networks unseen
    python -m tools.prior.train_prior --corpus tools/prior/corpus_tables/*.npz --out /tmp/prior \
        --init-model relax_tune/cost_model/pretrained --rounds 100   # corpus tables; continue
    python -m tools.prior.train_prior --corpus tools/prior/corpus_tables/intel-*.npz --out /tmp/p \
        --init-model relax_tune/cost_model/pretrained --rounds 50 \
        --keep-base-on tests/data/prior_heldout.npz    # ... keeping its ranking on its Zen 4
    python -m tools.prior.train_prior --corpus tools/prior/corpus_tables/amd-epyc_znver*.npz \
        --init-model relax_tune/cost_model/pretrained --rounds 100 --vector-bytes 32 \
        --test-data tests/data/prior_heldout_avx2.npz   # the shipped variant for 32-byte vectors

An XGBoost ``rank:pairwise`` model, one group per (workload, target), labels the normalised
throughput within the group, on ``transfer_features``; each round grows 4 trees on
subsamples and averages them (``num_parallel_tree``): one such model ranks held-out
workloads about as well whatever its seed, where single trees per round moved held-out
Kendall tau between 0.20 and 0.30 from one seed to the next (AMD EPYC Zen 4 corpora).
Continuing a model (``--init-model``) on another CPU's corpus moves its ranking on every
CPU; ``--keep-base-on`` adds the base's own ranking of the new candidates under its machine's
facts to the training data (``base_rankings``), so the added trees keep the base's ranking
there and change it only where they split on the machine facts. ``--vector-bytes N`` writes
the model as the variant for targets of N-byte vectors (``prior.VARIANT_DIR`` in ``--out``):
such a target is ranked by it alone, so it may trade other CPUs' ranking for its own, and it
is trained only on corpora measured on such CPUs.

Workloads marked held-out in the corpus are never trained on; the script prints their
ranking (Kendall tau, whether the true best is in the predicted top 10) and stores it in
the metadata. Reproducible: a fixed seed, one thread and a sorted corpus give the same trees
(``train`` is what the tests call).
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Sequence

import numpy as np

from relax_tune.cost_model.features import FEATURE_VERSION
from relax_tune.cost_model.prior import PRIOR_MODEL_FILE, VARIANT_DIR, load_prior, prior_files
from relax_tune.cost_model.transfer import (N_TRANSFER, TRANSFER_VERSION, task_reference,
                                            transfer_features)

from tools.prior.corpus import (TaskData, labels, load_corpus, ranking_metrics, reference_rows,
                                transfer_matrix, write_table)

PARAMS = {"objective": "rank:pairwise", "lambdarank_pair_method": "mean",
          "lambdarank_num_pair_per_sample": 8, "eta": 0.1, "max_depth": 3,
          "min_child_weight": 2.0, "subsample": 0.8, "colsample_bytree": 0.6,
          "tree_method": "hist", "num_parallel_tree": 4, "verbosity": 0}
ROUNDS = 200
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo


def training_arrays(tasks: list[TaskData], base=None, keep_facts: Sequence[dict] = ()
                    ) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """``(X, y, group sizes)`` of ``tasks`` (each a group; groups of fewer than 2 rows
    dropped); with ``base`` and ``keep_facts``, also ``base_rankings`` of the tasks under each
    machine's facts."""
    xs, ys, groups = [], [], []
    for task in tasks:
        if len(task.secs) < 2:
            continue
        xs.append(transfer_matrix(task))
        ys.append(labels(task.secs))
        groups.append(len(task.secs))
        for facts in keep_facts if base is not None else ():
            x, y = base_rankings(base, task, facts)
            xs.append(x)
            ys.append(y)
            groups.append(len(y))
    return np.concatenate(xs), np.concatenate(ys), groups


def base_rankings(base, task: TaskData, facts: dict) -> tuple[np.ndarray, np.ndarray]:
    """``task``'s candidates as if on the machine of ``facts``, labelled with ``base``'s
    ranking of them there (within-task ranks in [0, 1]).

    Continuing a model on one CPU's records moves its ranking on every CPU: the machine facts
    are constant within that corpus, so the added trees have no reason to split on them. Trained
    alongside the measurements, these rows ask the added trees to keep the base's ranking on
    the other machine (a distillation), which they can only do by splitting on the facts."""
    import xgboost as xgb

    x = transfer_features(task.features, task_reference(reference_rows(task)), facts)
    scores = base.predict(xgb.DMatrix(x))
    ranks = np.argsort(np.argsort(scores, kind="stable"), kind="stable")
    return x, ranks / max(1, len(ranks) - 1)


def train(tasks: list[TaskData], seed: int = 1, rounds: int = ROUNDS, params: dict | None = None,
          init=None, keep_facts: Sequence[dict] = ()):
    """The trained booster (one thread, ``seed``: reproducible); with ``init`` (a booster
    or a model file) its trees come first and ``rounds`` more are fitted to ``tasks`` (and,
    with ``keep_facts``, to ``init``'s own ranking under those machines' facts:
    ``base_rankings``)."""
    import xgboost as xgb

    if isinstance(init, xgb.Booster):  # a live booster carries its random state: not reproducible
        init = init.save_raw("ubj")
    base = None
    if init is not None and keep_facts:
        base = xgb.Booster()
        base.load_model(bytearray(init) if isinstance(init, (bytes, bytearray)) else init)
        base.set_param({"nthread": 1})
    x, y, groups = training_arrays(tasks, base, keep_facts)
    dtrain = xgb.DMatrix(x, label=y)
    dtrain.set_group(groups)
    p = dict(PARAMS if params is None else params)
    p.update({"seed": seed, "nthread": 1})
    return xgb.train(p, dtrain, num_boost_round=rounds, xgb_model=init)


def evaluate(booster, tasks: list[TaskData]) -> dict[str, dict[str, float]]:
    """Ranking metrics of ``booster`` on every task, by task name."""
    import xgboost as xgb

    return {t.name: ranking_metrics(booster.predict(xgb.DMatrix(transfer_matrix(t))), t.secs)
            for t in tasks}


def cross_validate(tasks: list[TaskData], seed: int, rounds: int, every: int = 2,
                   min_candidates: int = 64, init=None, keep_facts: Sequence[dict] = ()
                   ) -> dict[str, dict[str, float]]:
    """Leave-one-workload-out ranking: for every ``every``-th training task with at least
    ``min_candidates`` candidates, train without its workload (in every corpus; continuing
    ``init`` when given) and rank it."""
    folds = [t for t in tasks if len(t.secs) >= min_candidates][::every]
    out = {}
    for fold in folds:
        booster = train([t for t in tasks if t.workload != fold.workload], seed, rounds,
                        init=init, keep_facts=keep_facts)
        out.update(evaluate(booster, [fold]))
    return out


TEST_WORKLOADS = ("matmul_256", "conv2d_nchw_c96_h20")


def _regex(text: str) -> re.Pattern:
    try:
        return re.compile(text)
    except re.error as err:
        raise argparse.ArgumentTypeError(f"not a regular expression ({err}): {text!r}")


def _base_model(model_dir: str):
    """``(booster, condensed metadata)`` of the model ``--init-model`` continues."""
    model_path, meta_path = prior_files(model_dir)
    if not os.path.isfile(model_path):
        raise SystemExit(f"--init-model {model_dir}: no {PRIOR_MODEL_FILE} there")
    try:
        booster, meta = load_prior(model_path, meta_path)
    except FileNotFoundError as err:
        raise SystemExit(f"--init-model {model_dir}: {err}")
    except ValueError as err:  # load_prior's check of the feature versions
        raise SystemExit(f"--init-model {model_dir}: trained on other features: {err}")
    keep = ("targets", "train_candidates", "rounds", "corpus", "continued_from", "train_tasks",
            "heldout_tasks")
    return booster, {k: meta.get(k) for k in keep}


def _distinct_facts(tasks: list[TaskData]) -> list[dict]:
    """The distinct machine facts of ``tasks``, in a fixed order."""
    seen = {json.dumps(t.facts, sort_keys=True) for t in tasks}
    return [json.loads(text) for text in sorted(seen)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", nargs="+", default=["/work/corpus"], metavar="DIR",
                        help="corpus directories (make_corpus.py --out), trained on together")
    parser.add_argument("--out", default=os.path.join(ROOT, "relax_tune", "cost_model",
                                                       "pretrained"),
                        help="where the model goes (default: the package's pretrained/)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--test-data", default=None, metavar="NPZ",
                        help="also write the held-out workloads TEST_WORKLOADS as the tests' "
                             "fixed data file (tests/data/prior_heldout.npz)")
    parser.add_argument("--exclude", default=None, metavar="REGEX", type=_regex,
                        help="workloads to leave out of training altogether (e.g. "
                             "'(resnet18|bert)\\.' keeps the networks bench_real_models.py "
                             "times unseen)")
    parser.add_argument("--init-model", default=None, metavar="DIR",
                        help="continue a trained model (a directory holding "
                             f"{PRIOR_MODEL_FILE}, e.g. the package's pretrained/) with "
                             "--rounds more rounds on this corpus: extends a model whose "
                             "corpus is gone with another machine's records")
    parser.add_argument("--keep-base-on", nargs="+", default=[], metavar="TABLE",
                        help="with --init-model: keep the base model's ranking on the machines "
                             "these corpora (tables or directories) were measured on: their "
                             "machine facts, with the base's ranking of this corpus's "
                             "candidates there, are trained on alongside the measurements "
                             "(e.g. tests/data/prior_heldout.npz for the shipped model's AMD "
                             "Zen 4)")
    parser.add_argument("--vector-bytes", type=int, default=None, metavar="N",
                        help=f"write the model as the variant for targets of N-byte vectors "
                             f"(--out/{VARIANT_DIR.format('N')}/; e.g. 32: AVX2), trained on "
                             "corpora of such targets only")
    parser.add_argument("--cross-validate", action="store_true",
                        help="also rank every other training task (of 64 candidates or more) "
                             "with a model trained without its workload; print the mean")
    args = parser.parse_args()
    init, base_meta = _base_model(args.init_model) if args.init_model else (None, None)
    if args.keep_base_on and init is None:
        parser.error("--keep-base-on needs --init-model (the base whose ranking is kept)")
    keep_facts = _distinct_facts(load_corpus(args.keep_base_on, FEATURE_VERSION)
                                 if args.keep_base_on else [])
    tasks = load_corpus(args.corpus, FEATURE_VERSION)
    train_tasks = [t for t in tasks if t.split == "train"
                   and not (args.exclude and args.exclude.match(t.workload))]
    if args.exclude:
        left = sum(t.split == "train" for t in tasks) - len(train_tasks)
        print(f"--exclude {args.exclude.pattern}: {left} training tasks left out")
    heldout = [t for t in tasks if t.split == "heldout"]
    trained_on = _distinct_facts(train_tasks)
    other_width = [t for t in tasks if args.vector_bytes is not None
                   and t.facts.get("vector_bytes") != args.vector_bytes]
    if other_width:
        width = int(other_width[0].facts.get("vector_bytes", 0))
        parser.error(f"--vector-bytes {args.vector_bytes}: {other_width[0].name} was measured "
                     f"on a target of {width}-byte vectors; train the variant on corpora of "
                     "its own vector width")
    same = [f for f in keep_facts if f in trained_on]
    if same:
        parser.error(f"--keep-base-on: {same[0]} are also the facts of the corpus trained on; "
                     "keep the base's ranking on another machine than the one it learns")
    print(f"corpus {' '.join(args.corpus)}: {len(train_tasks)} train tasks "
          f"({sum(len(t.secs) for t in train_tasks)} candidates), {len(heldout)} held out")
    booster = train(train_tasks, args.seed, args.rounds, init=init, keep_facts=keep_facts)
    results = evaluate(booster, heldout)
    for name, m in results.items():
        print(f"  held out {name.split('@')[0]:32s} tau {m['tau']:+.3f}  best in top-10 "
              f"{m['best_in_top']:.0f}  top-10 overlap {m['top_overlap']:.2f}")
    if results:
        print(f"  mean tau {np.mean([m['tau'] for m in results.values()]):+.3f}")
    if args.cross_validate:
        cv = cross_validate(train_tasks, args.seed, args.rounds, init=init,
                            keep_facts=keep_facts)
        print(f"  left out one at a time: {len(cv)} tasks, mean tau "
              f"{np.mean([m['tau'] for m in cv.values()]):+.3f}, true best in top-10 "
              f"{np.mean([m['best_in_top'] for m in cv.values()]):.2f}")
    out = args.out if args.vector_bytes is None else \
        os.path.join(args.out, VARIANT_DIR.format(args.vector_bytes))
    os.makedirs(out, exist_ok=True)
    model_out, meta_out = prior_files(out)
    booster.save_model(model_out)
    base = base_meta or {}
    meta = {"feature_version": FEATURE_VERSION, "transfer_version": TRANSFER_VERSION,
            "n_columns": N_TRANSFER, "params": {**PARAMS, "seed": args.seed},
            "rounds": args.rounds, "excluded": args.exclude and args.exclude.pattern,
            # with --init-model: everything the model has been trained on, both parts
            "train_tasks": sorted({t.workload for t in train_tasks}
                                  | set(base.get("train_tasks") or ())),
            "heldout_tasks": sorted({t.workload for t in heldout}
                                    | set(base.get("heldout_tasks") or ())),
            "targets": sorted({t.target for t in train_tasks} | set(base.get("targets") or ())),
            "train_candidates": int(sum(len(t.secs) for t in train_tasks)
                                    + (base.get("train_candidates") or 0)),
            "corpus": [os.path.basename(c.rstrip("/")) for c in args.corpus],
            "continued_from": base_meta,
            "vector_bytes": args.vector_bytes,
            "kept_base_on": keep_facts,
            "heldout_metrics": {k.split("@")[0]: v for k, v in results.items()}}
    with open(meta_out, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    if args.test_data:
        write_table([t for t in heldout if t.workload in TEST_WORKLOADS], args.test_data,
                    FEATURE_VERSION)
        print(f"wrote {args.test_data} ({os.path.getsize(args.test_data) / 1024:.0f} KiB)")
    print(f"wrote {model_out} ({os.path.getsize(model_out) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
