"""Database maintenance behind ``relax-tune db``: merge work_dirs, keep the top-k records per
workload, export the best schedules (JSON) or every record (CSV)."""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Sequence

from ..database import Database, TuningRecord, candidate_key, is_baseline
from ..report import WorkloadSummary, short_target, summarize
from ..utils import RelaxTuneError

logger = logging.getLogger(__name__)


def _record_identity(record: TuningRecord) -> tuple[str, str]:
    return candidate_key(record.trace_json), json.dumps(record.target_config, sort_keys=True)


def _copy(record: TuningRecord, dest: Database) -> None:
    workload = dest.commit_workload(record.workload.mod)
    dest.commit_tuning_record(TuningRecord(record.trace_json, workload, record.run_secs,
                                           record.target_config, record.args_info))


def merge_databases(sources: Sequence[Database], dest: Database) -> int:
    """Append to ``dest`` every record of ``sources`` (in their order) that ``dest`` lacks; a
    record is the same when its workload, trace and target are. Returns how many were added.

    Each source's records keep their relative order, so trial order stays meaningful."""
    known: dict[int, set[tuple[str, str]]] = {}  # id(dest workload) -> identities held

    def held(workload) -> set[tuple[str, str]]:
        key = id(workload)
        if key not in known:
            known[key] = {_record_identity(r) for r in dest.get_records(workload)}
        return known[key]

    added = 0
    for source in sources:
        for record in source.get_all_tuning_records():
            workload = dest.commit_workload(record.workload.mod)
            ident = _record_identity(record)
            if ident in held(workload):
                continue
            dest.commit_tuning_record(TuningRecord(record.trace_json, workload, record.run_secs,
                                                   record.target_config, record.args_info))
            held(workload).add(ident)
            added += 1
    return added


def prune_database(source: Database, dest: Database, top_k: int = 1,
                   keep_baseline: bool = True) -> int:
    """Commit to ``dest`` the ``top_k`` fastest valid records of every workload of ``source``
    (failed ones dropped) and, with ``keep_baseline``, its untuned-function record (so speedups
    stay known and a resumed run does not time it again). Returns the records written."""
    if top_k < 1:
        raise RelaxTuneError(f"--top-k must be at least 1, not {top_k}")
    written = 0
    for workload in source.get_all_workloads():
        records = source.get_records(workload)
        keep = {id(r) for r in source.get_top_k(workload, top_k)}
        for record in records:  # commit order: a pruned file still reads as a trial history
            is_base = is_baseline(record)
            if id(record) in keep or (keep_baseline and is_base and record.is_valid):
                _copy(record, dest)
                written += 1
    return written


def export_best_json(summaries: Sequence[WorkloadSummary], path: str) -> None:
    """Write one JSON object per workload: name, hash, shape, trials, untuned and best seconds,
    the best record's target, run times and trace (MetaSchedule's JSON trace form)."""
    items = []
    for s in summaries:
        rec = s.best_record
        items.append({
            "workload": s.index, "name": s.name, "shash": str(s.shash), "shape": s.shape,
            "weight": s.weight, "trials": s.trials, "failures": s.failures,
            "baseline_secs": s.baseline_secs, "best_secs": s.best_secs,
            "target": rec.target_config if rec else None,
            "run_secs": rec.run_secs if rec else None,
            "trace": rec.trace_json if rec else None})
    _write_text(path, json.dumps(items, indent=1))


def export_records_csv(db: Database, summaries: Sequence[WorkloadSummary], path: str) -> int:
    """Write every record as a CSV row (workload, name, trial, mean seconds, valid, target,
    baseline flag), in file order; returns the rows written."""
    names = {int(s.shash): s.name for s in summaries}
    index = {int(s.shash): s.index for s in summaries}
    trials: dict[int, int] = {}
    rows = []
    for record in db.get_all_tuning_records():
        shash = int(record.workload.shash)
        is_base = is_baseline(record)
        trial = ""
        if not is_base:
            trials[shash] = trials.get(shash, 0) + 1
            trial = trials[shash]
        rows.append([index.get(shash, ""), names.get(shash, ""), str(shash), trial,
                     repr(record.mean_run_secs), int(record.is_valid),
                     short_target(record.target_config), int(is_base)])
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["workload", "name", "shash", "trial", "mean_secs", "valid", "target",
                         "baseline"])
        writer.writerows(rows)
    return len(rows)


def export_database(db: Database, path: str, fmt: str = "json",
                    meta: dict[int, dict] | None = None) -> int:
    """Export ``db`` to ``path``: ``"json"`` (best schedule per workload) or ``"csv"`` (every
    record). Returns the number of items written."""
    summaries = summarize(db, meta)
    if fmt == "json":
        export_best_json(summaries, path)
        return len(summaries)
    if fmt == "csv":
        return export_records_csv(db, summaries, path)
    raise RelaxTuneError(f"unknown export format {fmt!r}; use json or csv")


def _write_text(path: str, text: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(parent, exist_ok=True)
        with open(path, "w", encoding="utf-8") as file:
            file.write(text + "\n")
    except OSError as err:
        raise RelaxTuneError(f"cannot write {path!r} ({err.strerror or err})") from None
