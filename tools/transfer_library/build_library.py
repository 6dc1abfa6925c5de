"""Build the schedule library shipped with the package (``relax_tune/transfer/library``).

    python -m tools.transfer_library.build_library --tune --seconds 240   # tune, then export
    python -m tools.transfer_library.build_library                        # export only
    python -m tools.transfer_library.build_library --tune --add           # another CPU kind's
                                                                          # schedules beside them
    python -m tools.transfer_library.build_library --remeasure            # this CPU's record of
                                                                          # each workload: the
                                                                          # fastest here of all

``--tune`` tunes each library model through the "relax_tune" pipeline for ``--seconds`` into
``--work-root/<model>``; the export then keeps the best valid record of every workload of
those work_dirs (baselines and failures left out) and writes them, with a ``README.md``
naming the models, the machine and the commit, into ``relax_tune/transfer/library``.

The library's models are the benchmark's model families at other shapes (images of 160
and 112 instead of 224, transformers of other widths and lengths), so that the real-model
benchmark measures what a user gets from schedules of *alike* workloads, not of the same
ones.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time

# (name in the library, benchmark model, size, transformer dims)
LIBRARY_MODELS = [
    ("resnet18-160", "resnet18", 160, {}),
    ("mobilenet_v2-160", "mobilenet_v2", 160, {}),
    # at 112 the later stages run at 7x7 and 14x14 as at 224 (160 gives 5x5 and 10x10),
    # with other channel counts
    ("resnet18-112", "resnet18", 112, {}),
    ("mobilenet_v2-112", "mobilenet_v2", 112, {}),
    ("bert-d384-seq64", "bert", 64, {"d": 384, "heads": 6, "ff": 1536}),
    ("vit-d256-160", "vit", 160, {"d": 256, "heads": 4, "ff": 1024}),
]


def tune_model(name: str, family: str, size: int, dims: dict, work_dir: str,
               seconds: float, threads: int) -> None:
    """Tune one library model for ``seconds`` into ``work_dir`` (the pipeline's tasks)."""
    import tvm
    from tvm import relax

    import relax_tune as rt
    from benchmarks.real_models import make_model, set_torch_threads
    from relax_tune.model_loader import from_torch

    import torch
    set_torch_threads(torch, threads)
    model, inputs, desc = make_model(family, False, size, **dims)
    loaded = from_torch(model, name, inputs)
    target = rt.host_target()
    start = time.perf_counter()
    tvm.compile(loaded.mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=work_dir, max_time=seconds,
        params=loaded.params))
    print(f"{name} ({desc}): tuned and compiled in {time.perf_counter() - start:.0f} s",
          flush=True)


def export(work_dirs: dict[str, str], out_dir: str, keep_existing: bool = False,
           chosen: list | None = None) -> tuple[int, int]:
    """Write the best valid record of each workload of ``work_dirs`` for each target (the
    CPU LLVM names and its features: two CPUs of one machine class,
    ``transfer.source.machine_class``, keep a record each, and a task prefers the one of
    its own target) into ``out_dir`` (replaced); with ``keep_existing`` the library's
    records already there are candidates too, so a build on another kind of CPU adds its
    schedules beside them. ``chosen`` records (``remeasure``) replace those of their
    workload and target whatever their times. Returns (workloads, records)."""
    from relax_tune.database import JSONDatabase, TuningRecord
    from relax_tune.database.records import is_baseline

    sources = [JSONDatabase(work_dir=wd) for wd in work_dirs.values()]
    if keep_existing and os.path.isfile(os.path.join(out_dir, "database_workload.json")):
        sources.insert(0, JSONDatabase(work_dir=out_dir))
    best: dict[tuple, tuple] = {}  # (program, target) -> (record, workload)
    for db in sources:
        for wl in db.get_all_workloads():
            for rec in db.get_top_k(wl, 64):
                if not rec.is_valid or is_baseline(rec.trace_json):
                    continue
                key = (wl.shash, str(rec.target))
                if key not in best or rec.mean_run_secs < best[key][0].mean_run_secs:
                    best[key] = (rec, wl)
    for rec in chosen or []:
        best[(rec.workload.shash, str(rec.target))] = (rec, rec.workload)
    tmp = out_dir + ".new"
    shutil.rmtree(tmp, ignore_errors=True)
    out = JSONDatabase(work_dir=tmp)
    for rec, wl in best.values():
        out.commit_tuning_record(TuningRecord(
            trace_json=rec.trace_json, workload=out.commit_workload(wl.mod),
            run_secs=rec.run_secs, target=rec.target, args_info=rec.args_info))
    del out
    for name in os.listdir(tmp):  # only the two database files are shipped
        if not name.startswith("database_"):
            path = os.path.join(tmp, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    readme = os.path.join(out_dir, "README.md")
    if keep_existing and os.path.isfile(readme):  # it describes the records kept
        shutil.copy(readme, tmp)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)
    return len({program for program, _ in best}), len(best)


def _describe(out_dir: str, seconds: float | None, threads: int, add: bool = False,
              models: list[str] | None = None) -> None:
    from benchmarks.real_models import cpu_model

    import relax_tune as rt
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "?"
    made = ("Made by `python -m tools.transfer_library.build_library"
            + (f" --tune --seconds {seconds:g}" if seconds else "") + (" --add" if add else "")
            + f"` at commit {commit}, on {cpu_model()} (target `{rt.host_target()}`), "
            f"{threads} threads.")
    if add:  # another machine's records beside those the README already describes
        with open(os.path.join(out_dir, "README.md"), "a", encoding="utf-8") as f:
            f.write("\nAdded (the best record of each workload for this CPU's target, the "
                    "others kept): " + made + (f" Models: {', '.join(models)}." if models
                                               else "") + "\n")
        return
    lines = ["# The shipped schedule library", "", made,
             "", "Models (the benchmark's families at other shapes):", ""]
    lines += [f"- `{name}`: {family}, size {size}" + (f", {dims}" if dims else "")
              for name, family, size, dims in LIBRARY_MODELS]
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tune", action="store_true", help="tune the models first")
    parser.add_argument("--seconds", type=float, default=240.0, help="tuning time per model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work-root", default="transfer-library-work")
    parser.add_argument("--models", nargs="*", default=[m[0] for m in LIBRARY_MODELS])
    parser.add_argument("--add", action="store_true",
                        help="keep the library's records and add the best of this CPU's "
                             "beside them (a build on another kind of CPU)")
    parser.add_argument("--remeasure", action="store_true",
                        help="then time every target's record of each workload on this "
                             "machine and keep the fastest as this CPU's (remeasure.py); "
                             "alone, on the library as it is")
    args = parser.parse_args(argv)
    from relax_tune.transfer import LIBRARY_DIR

    if args.remeasure and not args.tune and not args.add:
        return _remeasure(LIBRARY_DIR, args.threads)
    work_dirs = {name: os.path.join(args.work_root, name) for name in args.models}
    if args.tune:
        os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
        for name, family, size, dims in LIBRARY_MODELS:
            if name in args.models:
                tune_model(name, family, size, dims, work_dirs[name], args.seconds,
                           args.threads)
    missing = [wd for wd in work_dirs.values() if not os.path.isdir(wd)]
    if missing:
        print(f"no work_dir {missing[0]!r}: run with --tune first", file=sys.stderr)
        return 1
    workloads, records = export(work_dirs, LIBRARY_DIR, keep_existing=args.add)
    _describe(LIBRARY_DIR, args.seconds if args.tune else None, args.threads, add=args.add,
              models=args.models)
    print(f"{LIBRARY_DIR}: {records} records of {workloads} workloads")
    return _remeasure(LIBRARY_DIR, args.threads) if args.remeasure else 0


def _remeasure(library: str, threads: int) -> int:
    """Time the library's records of every target here; keep the fastest as this CPU's."""
    import relax_tune as rt
    from relax_tune.database import JSONDatabase
    from relax_tune.measure import LocalBuilder, LocalRunner

    from .remeasure import remeasure

    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    target = rt.host_target()
    builder, runner = LocalBuilder(), LocalRunner()
    try:
        chosen = remeasure(JSONDatabase(work_dir=library), target, builder, runner)
    finally:
        builder.shutdown()
        runner.shutdown()
    workloads, records = export({}, library, keep_existing=True, chosen=chosen)
    from benchmarks.real_models import cpu_model
    with open(os.path.join(library, "README.md"), "a", encoding="utf-8") as f:
        f.write(f"\nRemeasured (`--remeasure`) on {cpu_model()} (target `{target}`), {threads} "
                f"threads: {len(chosen)} of this target's records are now another target's "
                "schedule that ran faster here.\n")
    print(f"{library}: {len(chosen)} records replaced or added for {target}; "
          f"{records} records of {workloads} workloads")
    return 0


if __name__ == "__main__":
    sys.exit(main())
