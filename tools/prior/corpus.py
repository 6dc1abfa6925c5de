"""The measured-candidate corpus: its record format and how to read it.

A corpus is a directory (kept out of the package and the repository, e.g. /work/corpus)::

    corpus/
      records/<workload>@<target tag>.jsonl   one measured candidate per line (below)
      work/<workload>@<target tag>/           the tuning work_dir it came from (database,
                                              cost model, logs): regenerate features from it

One record (a JSON object per line)::

    {"v": 1,                          format version
     "workload": "matmul_256",        workload name (``make_corpus.WORKLOADS``)
     "op": "matmul",                  operator family (held-out operators are whole families)
     "split": "train" | "heldout",    held out of training: other shapes, other operators
     "shash": "1234...",              structural hash of the workload (the task key)
     "target": "llvm -mcpu=znver4 -num-cores=2",   the target it was measured for ...
     "host": "AMD EPYC ...",          ... on this CPU (lscpu's model name)
     "facts": {"vector_bytes": 64, "num_cores": 2, "l1_bytes": ..., "l2_bytes": ...,
               "l3_bytes": ...},      what the target/host say about the machine
     "order": 17,                     position in the tuning session (commit order)
     "phase": "random" | "evolutionary",   how the candidate was found
     "key": "ab12...",                candidate_key of the trace
     "trace": [...],                  the trace (plain JSON, replays with schedule_from_json)
     "secs": 1.2e-4,                  mean run seconds (1e10: failed to build or run)
     "baseline_secs": 3.4e-3,         the untuned function's seconds (None if not measured)
     "load": 2.1,                     1-minute load average when the workload's (last) run
                                      started: a loaded machine slows parallel kernels most
     "feature_version": 1,            relax_tune.cost_model.FEATURE_VERSION
     "features": [...]}               extract_features of the replayed trace (raw, unnormalised)

Times are comparable within one workload and target (one session, one machine); only ranks
within a task are used for training.

A corpus table (``write_table`` / ``read_table``, one compressed ``.npz``) keeps what training
needs of a corpus - per task its workload, operator, split, target and machine facts; per
candidate its raw features, seconds, commit order and phase - without the traces, at about a
fiftieth of the records' size. ``load_corpus`` reads tables wherever it reads directories, so a
corpus measured on a machine that is gone (each session may get another CPU) still trains
the next model: ``python -m tools.prior.corpus DIR... --table OUT.npz`` writes one. The tests'
held-out data (``tests/data/prior_heldout.npz``) is such a table of two workloads.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FORMAT_VERSION = 1


@dataclass
class TaskData:
    """The measured candidates of one workload on one target (one ranking group)."""

    workload: str
    op: str
    split: str
    target: str
    facts: dict
    features: np.ndarray  # raw features, one row per candidate
    secs: np.ndarray      # mean seconds (1e10: failed)
    order: np.ndarray     # commit order within the session
    phase: list[str]

    @property
    def name(self) -> str:
        """``workload@target``: one group of the ranking objective."""
        return f"{self.workload}@{self.target}"


def read_records(path: str) -> list[dict]:
    """Every record of one ``records/*.jsonl`` file (a torn last line is skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def load_corpus(corpus_dirs: str | Sequence[str], feature_version: int | None = None
                ) -> list[TaskData]:
    """One ``TaskData`` per records file of each of ``corpus_dirs`` (one directory or several,
    in the order given; files sorted by name; a ``.npz`` entry is a corpus table), keeping only
    records of ``feature_version`` when given. The same workload in two directories is two
    tasks (two measuring sessions: their times are ranked each within its own)."""
    dirs = [corpus_dirs] if isinstance(corpus_dirs, str) else list(corpus_dirs)
    tasks = []
    for d in dirs:
        if d.endswith(".npz"):
            tasks += read_table(d, feature_version)
        elif not os.path.isdir(d):
            raise FileNotFoundError(f"no corpus directory or table {d!r} (make_corpus.py --out "
                                    "writes a directory, corpus.py --table a table)")
        else:
            tasks += _load_records(sorted(glob.glob(os.path.join(d, "records", "*.jsonl"))),
                                   feature_version)
    return tasks


def _load_records(paths: list[str], feature_version: int | None) -> list[TaskData]:
    tasks = []
    for path in paths:
        recs = [r for r in read_records(path)
                if feature_version is None or r.get("feature_version") == feature_version]
        if not recs:
            continue
        recs.sort(key=lambda r: r["order"])
        r0 = recs[0]
        tasks.append(TaskData(
            workload=r0["workload"], op=r0["op"], split=r0["split"], target=r0["target"],
            facts=dict(r0["facts"]),
            features=np.asarray([r["features"] for r in recs], dtype=np.float32),
            secs=np.asarray([r["secs"] for r in recs], dtype=np.float64),
            order=np.asarray([r["order"] for r in recs]),
            phase=[r["phase"] for r in recs]))
    return tasks


TABLE_VERSION = 1


def write_table(tasks: Sequence[TaskData], path: str, feature_version: int) -> None:
    """Write ``tasks`` as a corpus table (compressed npz; features as float32)."""
    from relax_tune.cost_model.transfer import FACT_NAMES

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    np.savez_compressed(
        path, table_version=TABLE_VERSION, feature_version=feature_version,
        names=np.asarray([t.workload for t in tasks]), ops=np.asarray([t.op for t in tasks]),
        splits=np.asarray([t.split for t in tasks]),
        targets=np.asarray([t.target for t in tasks]),
        fact_names=np.asarray(FACT_NAMES),
        facts=np.asarray([[t.facts[n] for n in FACT_NAMES] for t in tasks]),
        x=np.concatenate([t.features for t in tasks]).astype(np.float32),
        secs=np.concatenate([t.secs for t in tasks]),
        order=np.concatenate([t.order for t in tasks]),
        task=np.concatenate([np.full(len(t.secs), i) for i, t in enumerate(tasks)]),
        random=np.concatenate([[p == "random" for p in t.phase] for t in tasks]))


def read_table(path: str, feature_version: int | None = None) -> list[TaskData]:
    """The tasks of a corpus table (none when its features are not of ``feature_version``).
    Tables written before operators, splits and targets were stored (the tests' first
    held-out file) read as held-out tasks of an unknown target."""
    data = np.load(path, allow_pickle=False)
    if int(data.get("table_version", 1)) > TABLE_VERSION:
        raise ValueError(f"corpus table {path} is of a newer format (version "
                         f"{int(data['table_version'])}, this reads {TABLE_VERSION})")
    if feature_version is not None and int(data.get("feature_version", 1)) != feature_version:
        return []
    names = [str(n) for n in data["names"]]
    n = len(names)
    ops = [str(o) for o in data["ops"]] if "ops" in data else ["?"] * n
    splits = [str(s) for s in data["splits"]] if "splits" in data else ["heldout"] * n
    targets = [str(t) for t in data["targets"]] if "targets" in data else ["?"] * n
    fact_names = [str(f) for f in data["fact_names"]]
    tasks = []
    for i in range(n):
        sel = data["task"] == i
        order = data["order"][sel] if "order" in data else np.arange(int(sel.sum()))
        tasks.append(TaskData(
            workload=names[i], op=ops[i], split=splits[i], target=targets[i],
            facts=dict(zip(fact_names, data["facts"][i].tolist())),
            features=data["x"][sel], secs=data["secs"][sel], order=order,
            phase=["random" if r else "evolutionary" for r in data["random"][sel]]))
    return tasks


def reference_rows(task: TaskData) -> np.ndarray:
    """The rows a task's reference vector is taken from: its randomly sampled candidates
    (what the search's first pool holds when the model first ranks the task), or all."""
    rand = np.asarray([p == "random" for p in task.phase])
    return task.features[rand] if rand.sum() >= 8 else task.features


def transfer_matrix(task: TaskData) -> np.ndarray:
    """The task's candidates as the pre-trained model sees them."""
    from relax_tune.cost_model.transfer import task_reference, transfer_features

    return transfer_features(task.features, task_reference(reference_rows(task)), task.facts)


def labels(secs: np.ndarray) -> np.ndarray:
    """Normalised throughput within a task: best / secs (1 for the best, 0 for failures)."""
    ok = secs < 0.5e10
    if not ok.any():
        return np.zeros(len(secs))
    return np.where(ok, secs[ok].min() / np.maximum(secs, 1e-12), 0.0)


def ranking_metrics(pred: np.ndarray, secs: np.ndarray, k: int = 10) -> dict[str, float]:
    """Kendall tau between predictions and speed over the valid candidates, whether the true
    best is among the top-``k`` predicted (recall@k of the best), and the share of the true
    top-``k`` among the predicted top-``k``."""
    from relax_tune.cost_model.prior import kendall_tau

    ok = secs < 0.5e10
    pred, secs = np.asarray(pred)[ok], np.asarray(secs)[ok]
    if len(secs) < 2:
        return {"tau": 0.0, "best_in_top": 0.0, "top_overlap": 0.0}
    top_pred = np.argsort(-pred, kind="stable")[:k]
    top_true = np.argsort(secs, kind="stable")[:k]
    return {"tau": kendall_tau(pred, -secs),
            "best_in_top": float(int(top_true[0]) in set(top_pred.tolist())),
            "top_overlap": len(set(top_pred.tolist()) & set(top_true.tolist())) / min(k, len(secs))}


def main() -> None:
    """``python -m tools.prior.corpus DIR... --table OUT.npz``: one table of the corpora."""
    parser = argparse.ArgumentParser(description="Write corpus directories as one table.")
    parser.add_argument("corpus", nargs="+", help="corpus directories or tables")
    parser.add_argument("--table", required=True, metavar="NPZ", help="the table to write")
    args = parser.parse_args()
    from relax_tune.cost_model.features import FEATURE_VERSION

    tasks = load_corpus(args.corpus, FEATURE_VERSION)
    if not tasks:
        parser.error(f"no records of feature version {FEATURE_VERSION} in {args.corpus}")
    write_table(tasks, args.table, FEATURE_VERSION)
    print(f"wrote {args.table}: {len(tasks)} tasks, {sum(len(t.secs) for t in tasks)} "
          f"candidates ({os.path.getsize(args.table) / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
