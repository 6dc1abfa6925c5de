"""Each predicted schedule of the no-measurement compile against its task's untuned function.

Issue 42's promise for ``measure=False`` is "never slower than the untuned build on any task".
For each model this lowers the ``torch.export`` import as the pipeline does, takes the
predicted schedules of a work_dir (``--work-root``'s ``<model>-rt-0s``, the benchmark's
no-measurement work_dir, when it exists; else ``tune_tasks(measure=False)`` writes them into
a fresh one there), and builds each predicted task's schedule and its untuned function with
the tuner's own builder. Both are timed by the tuner's runner in ``--rounds`` interleaved
rounds; printed per task are its calls in the model, both medians and their quotient, then
how many tasks the prediction made slower. The untuned builds dominate the run (an untuned
convolution takes LLVM 20-30 s on a Zen 3).

    python -m benchmarks.predicted_vs_untuned --models resnet18 mobilenet_v2 bert vit \\
        --work-root /work/bench --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.real_models import MODEL_NAMES, MORE_MODEL_NAMES, make_model


def predicted_tasks(name: str, work_root: str, target):
    """``(tasks, predicted database, work_dir)`` of model ``name`` (predicting into a fresh
    work_dir when ``work_root`` has no ``<name>-rt-0s``)."""
    import relax_tune as rt
    from relax_tune.model_loader import from_torch
    from relax_tune.work_dir import WorkDir

    model, inputs, _ = make_model(name, False)
    loaded = from_torch(model, name, inputs)
    tasks = rt.extract_tasks(loaded.lowered(target), target)
    work_dir = os.path.join(work_root, f"{name}-rt-0s")
    if not os.path.isdir(os.path.join(work_dir, "predicted")):
        work_dir = os.path.join(work_root, f"{name}-predicted-{int(time.time())}")
        rt.tune_tasks(tasks, work_dir, measure=False)
    return tasks, WorkDir.of(work_dir).open_predicted(), work_dir


def compare(tasks, predicted, target, rounds: int, builder, runner) -> list[tuple]:
    """``(task name, calls, untuned secs, predicted secs)`` of every task with a predicted
    schedule (medians over ``rounds`` interleaved rounds)."""
    from relax_tune.utils import trace_to_json

    rows = []
    for task in tasks:
        sch = predicted.query_schedule(task.mod, target)
        if sch is None:
            continue
        builds = builder.build(task.mod, target, [None, trace_to_json(sch.trace)])
        if not all(b.ok for b in builds):
            print(f"  {task.task_name}: build failed: {[b.error for b in builds if not b.ok]}")
            continue
        untuned, pred = [], []
        for _ in range(rounds):
            ru, rp = runner.run([b.artifact_path for b in builds], task.args_info, target)
            untuned.append(statistics.median(ru.run_secs))
            pred.append(statistics.median(rp.run_secs))
        rows.append((task.task_name, task.weight, statistics.median(untuned),
                     statistics.median(pred)))
        name, calls, u, p = rows[-1]
        print(f"| {name} | {calls} | {1e6 * u:.1f} | {1e6 * p:.1f} | {u / p:.2f}x |"
              f"{' **slower**' if p > u else ''}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "bert", "vit"],
                        choices=MODEL_NAMES + MORE_MODEL_NAMES)
    parser.add_argument("--work-root", required=True,
                        help="where the models' no-measurement work_dirs are (<model>-rt-0s) "
                             "or go")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    from relax_tune.utils import ensure_tvm_threads

    ensure_tvm_threads(args.threads)
    import relax_tune as rt
    from relax_tune.measure import LocalBuilder, LocalRunner

    target = rt.host_target()
    builder, runner = LocalBuilder(), LocalRunner()
    slower_all = []
    try:
        for name in args.models:
            tasks, predicted, work_dir = predicted_tasks(name, args.work_root, target)
            print(f"\n{name}: predicted schedules of {work_dir}, {args.rounds} rounds, "
                  f"{args.threads} threads\n\n| task | calls | untuned us | predicted us | "
                  f"speed-up |\n|---|---|---|---|---|", flush=True)
            rows = compare(tasks, predicted, target, args.rounds, builder, runner)
            slower = [r[0] for r in rows if r[3] > r[2]]
            slower_all += [f"{name}.{s}" for s in slower]
            print(f"\n{name}: {len(slower)} of {len(rows)} predicted tasks slower than untuned"
                  f"{': ' + ', '.join(slower) if slower else ''}", flush=True)
    finally:
        builder.shutdown()
        runner.shutdown()
    print(f"\nall: {len(slower_all)} predicted tasks slower than untuned")


if __name__ == "__main__":
    main()
