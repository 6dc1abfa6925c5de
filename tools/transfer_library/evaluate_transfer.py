"""How good a transferred schedule is: per task of a tuned work_dir, the kernel time of
(1) the no-measurement compile's predicted schedule, (2) the best schedule of the closest
*other* alike workload of the same work_dir, refitted (leave-self-out transfer), and (3) the
task's own best, each built and timed here, one after another.

    python -m tools.transfer_library.evaluate_transfer TUNED_WORK_DIR [PREDICTED_WORK_DIR]

PREDICTED_WORK_DIR is a work_dir of the same model compiled with ``measure=False`` (its
``predicted/`` schedules); without it that column is empty. Times are medians of 7 repeats
of at least 20 ms, on the threads TVM_NUM_THREADS gives (the machine's cores by default).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np


def _timer(target):
    import tvm

    from relax_tune.utils import args_info

    def time_ms(mod) -> float:
        lib = tvm.compile(mod, target)
        args = [tvm.runtime.tensor(np.random.rand(*[int(x) for x in a[2]]).astype(a[1]))
                for a in args_info(mod)]
        ev = lib.mod.time_evaluator("main", tvm.cpu(), number=5, repeat=7, min_repeat_ms=20)
        return float(np.median(ev(*args).results)) * 1e3

    return time_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tuned")
    parser.add_argument("predicted", nargs="?")
    args = parser.parse_args(argv)
    import tvm

    from relax_tune.database import JSONDatabase
    from relax_tune.database.records import is_baseline
    from relax_tune.space import space_for_target
    from relax_tune.transfer import refit_trace, shape_distance, workload_shape
    from relax_tune.utils import schedule_from_json, structural_hash

    db = JSONDatabase(work_dir=args.tuned)
    predicted = {}
    if args.predicted:
        pdb = JSONDatabase(work_dir=os.path.join(args.predicted, "predicted"))
        for wl in pdb.get_all_workloads():
            recs = pdb.get_records(wl)
            if recs:
                predicted[structural_hash(wl.mod)] = recs[0].trace_json
    workloads = db.get_all_workloads()
    shapes = [workload_shape(w.mod) for w in workloads]
    best = {}
    for i, wl in enumerate(workloads):
        recs = [r for r in db.get_top_k(wl, 4) if r.is_valid and not is_baseline(r.trace_json)]
        if recs:
            best[i] = recs[0]
    if not best:
        print(f"{args.tuned}: no tuned record", file=sys.stderr)
        return 1
    target = tvm.target.Target(next(iter(best.values())).target)
    space = space_for_target(target)
    time_ms = _timer(target)
    print("| task | distance | tiles kept | predicted ms | transferred ms | own best ms | "
          "workload |")
    print("|---|---|---|---|---|---|---|")
    for i, wl in enumerate(workloads):
        if i not in best:
            continue
        alike = sorted((shape_distance(shapes[i], shapes[j]), j) for j in best if j != i)
        if not alike or not math.isfinite(alike[0][0]):
            continue
        distance, j = alike[0]
        source = schedule_from_json(workloads[j].mod, best[j].trace_json)
        refitted, why = refit_trace(source, wl.mod)
        replayed = space.replay(wl.mod, refitted.trace) if refitted is not None else None
        if replayed is None or not replayed.ok:
            print(f"| {i} | {distance:.2f} | | | not valid: {why or replayed.error} | | |")
            continue
        pred = predicted.get(structural_hash(wl.mod))
        t_pred = time_ms(schedule_from_json(wl.mod, pred).mod) if pred else float("nan")
        t_transfer = time_ms(replayed.sch.mod)
        t_own = time_ms(schedule_from_json(wl.mod, best[i].trace_json).mod)
        print(f"| {i} | {distance:.2f} | {refitted.kept:.2f} | {t_pred:.4f} | {t_transfer:.4f} | {t_own:.4f} | "
              f"{'+'.join(part.split(':')[0] for part in shapes[i].key.split('|'))} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
