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
     "feature_version": 1,            relax_tune.cost_model.FEATURE_VERSION
     "features": [...]}               extract_features of the replayed trace (raw, unnormalised)

Times are comparable within one workload and target (one session, one machine); only ranks
within a task are used for training.
"""

from __future__ import annotations

import glob
import json
import os
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


def load_corpus(corpus_dir: str, feature_version: int | None = None) -> list[TaskData]:
    """One ``TaskData`` per records file of ``corpus_dir`` (sorted by file name), keeping
    only records of ``feature_version`` when given."""
    tasks = []
    for path in sorted(glob.glob(os.path.join(corpus_dir, "records", "*.jsonl"))):
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
