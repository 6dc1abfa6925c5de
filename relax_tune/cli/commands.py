"""The ``relax-tune`` command line: tune, compile, db show|merge|prune|export, report, demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

from ..paths import check_output_file
from ..utils import RelaxTuneError, error_line, host_target, parse_target
from ..work_dir import WorkDir
from .interrupt import EXIT_INTERRUPTED, handle_interrupts

logger = logging.getLogger(__name__)

_MODEL_HELP = ("an ONNX file (model.onnx; needs the onnx extra), a torch.export archive "
               "(model.pt2; needs the torch extra) or file.py:function / "
               "package.module:function returning a Relax IRModule, (IRModule, params), "
               "a torch.export.ExportedProgram or (torch.nn.Module, example_inputs)")
_TARGET_HELP = ("TVM target as a string or JSON dict, e.g. "
                "'{\"kind\": \"llvm\", \"mcpu\": \"znver3\", \"num-cores\": 2}' "
                "(default: this machine's CPU)")


def _target_arg(text: str | None):
    """The ``--target`` value: this machine's CPU when absent, a JSON dict, or a string."""
    if text is None:
        return host_target()
    text = text.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise RelaxTuneError(f"--target {text!r} is not valid JSON ({err.msg}); write e.g. "
                                 "'{\"kind\": \"llvm\", \"num-cores\": 2}'") from None
    return text


def _model_file(spec: str) -> str:
    """The file a model spec reads (``file.py`` of ``file.py:function``)."""
    path, sep, _ = spec.rpartition(":")
    return path if sep and path.endswith(".py") else spec


def _split_names(values: list[str] | None) -> list[str] | None:
    """``--op-names matmul,add conv`` -> ``["matmul", "add", "conv"]``."""
    if not values:
        return None
    return [name for value in values for name in value.split(",") if name]


def make_rpc_runner(text: str) -> Any:
    """An RPC runner for ``--rpc host:port:key`` (``relax_tune.measure.RPCRunner``)."""
    from ..measure import RPCRunner, parse_rpc_spec

    tracker, key = parse_rpc_spec(text)
    return RPCRunner(tracker, key)


def _dynamic_hints(args: argparse.Namespace):
    """``--dynamic n=1,16,64`` (repeatable) as shape hints, or None."""
    from ..dynamic import parse_shape_hints

    values = getattr(args, "dynamic", None)
    return parse_shape_hints(values) if values else None


def _tune_config(args: argparse.Namespace):
    """The tuning session the command line asks for (``relax_tune.TuneConfig``)."""
    from ..config import check_max_time, make_config

    if args.max_time is not None:
        check_max_time(args.max_time, "--max-time")
    wanted = {"max_trials_global": args.trials, "max_trials_per_task": args.trials_per_task,
              "max_time": args.max_time, "task_scheduler": args.scheduler,
              "num_trials_per_iter": args.trials_per_iter, "strategy": args.strategy,
              "seed": args.seed, "cost_model": args.cost_model,
              "op_names": _split_names(args.op_names),
              "shape_hints": _dynamic_hints(args),
              "transfer": False if args.no_transfer else None}
    return make_config(**{k: v for k, v in wanted.items() if v is not None})


# ---------------------------------------------------------------------------- tune
def _task_table(reports: list) -> str:
    from ..tuning.progress import format_tuning_table

    return format_tuning_table(reports)


def _say_int8(mod, target) -> None:
    """How a quantized model's convolutions and matmuls are computed (``int8="auto"``)."""
    from ..int8_choice import describe

    line = describe(mod, target)
    if line:
        print(f"relax-tune: {line}", flush=True)


def _tune(args: argparse.Namespace) -> int:
    from ..tuning.extract import extract_tasks
    from ..model_loader import load_model, parse_shape_dict
    from ..tuning.tune import tune_tasks

    config = _tune_config(args)
    work_dir = WorkDir.of(args.work_dir)
    work_dir.check_writable()  # before the model is loaded
    target = parse_target(_target_arg(args.target))
    model = load_model(args.model, parse_shape_dict(args.input_shape))
    tasks = extract_tasks(model.lowered(target), target, op_names=config.op_names,
                          shape_hints=config.shape_hints)
    _say_int8(model.mod, target)
    if not tasks:
        print("relax-tune: nothing to tune (no TIR function in the model)")
        return 0
    budget = ", ".join(part for part in (
        f"{args.trials} trials" if args.trials is not None else "",
        f"{args.max_time:g} s" if args.max_time is not None else "") if part) \
        or f"{config.trial_budget} trials"
    print(f"relax-tune: {len(tasks)} tasks of {args.model} on {target.kind.name} "
          f"({', '.join(t.task_name for t in tasks)}); {budget}, "
          f"work dir {args.work_dir}", flush=True)
    runner = make_rpc_runner(args.rpc) if args.rpc else None
    start = time.perf_counter()
    try:
        reports = tune_tasks(tasks, work_dir, config, runner=runner)
    except KeyboardInterrupt:
        print(f"\nrelax-tune: interrupted; every measured trial is kept in {args.work_dir}: "
              "run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if runner is not None:
            runner.shutdown()
    wall = time.perf_counter() - start
    print(_task_table(reports))
    new = sum(r.new_trials for r in reports)
    total = sum(r.applied_secs * r.weight for r in reports if r.applied_secs)
    untuned = sum(r.baseline_secs * r.weight for r in reports if r.baseline_secs)
    print(f"{new} new trials in {wall:.1f} s; estimated end-to-end {total * 1e6:.1f} us"
          + (f" (untuned {untuned * 1e6:.1f} us, {untuned / total:.2f}x)"
             if untuned and total else ""))
    print(f"next: relax-tune compile {args.model} --work-dir {args.work_dir} -o model.so; "
          f"relax-tune report {args.work_dir}")
    return 0


# ---------------------------------------------------------------------------- compile
def _compile(args: argparse.Namespace) -> int:
    from ..database import is_baseline
    from ..tuning.extract import extract_tasks
    from ..measure import cross
    from ..model_loader import load_model, parse_shape_dict

    target = parse_target(_target_arg(args.target))
    mode = cross.link_mode(target)  # a target of another ISA: its cross compiler links
    if mode == cross.LINK_TAR and not args.output.endswith(".tar"):
        triple = cross.target_triple(target)
        raise RelaxTuneError(f"no {triple}-gcc or {triple}-g++ on PATH to link {args.output} "
                             f"for {triple}: install a cross compiler (Debian: apt-get install "
                             f"gcc-{triple}) or write an archive the device links (-o model.tar)")
    work_dir = WorkDir.of(args.work_dir)
    check_output_file(args.output, "the library -o",
                      [*work_dir.own_files(), _model_file(args.model)],
                      f"the model or a file of the work dir {args.work_dir!r}")
    model = load_model(args.model, parse_shape_dict(args.input_shape))
    hints = _dynamic_hints(args)
    lowered = model.lowered(target)
    _say_int8(model.mod, target)
    tasks = extract_tasks(lowered, target, shape_hints=hints)
    if args.predict:  # the no-measurement compile: the model's first choices, nothing timed
        from ..tuning.tune import tune_tasks

        start = time.perf_counter()
        reports = tune_tasks(tasks, work_dir, measure=False, transfer=not args.no_transfer)
        print(f"relax-tune: predicted schedules for {sum(r.predicted for r in reports)} of "
              f"{len(tasks)} tasks in {time.perf_counter() - start:.1f} s (nothing measured)",
              flush=True)
    db = work_dir.open_for_apply() if args.predict else work_dir.open_existing()
    best = [db.query_tuning_record(t.mod, target) for t in tasks]
    tuned = sum(1 for rec in best if rec is not None and not is_baseline(rec))
    predicted = work_dir.open_predicted()
    guessed = 0 if predicted is None else sum(
        1 for t, rec in zip(tasks, best)
        if rec is None and predicted.query_schedule(t.mod, target) is not None)
    ex = model.compile_lowered(lowered, target, work_dir, shape_hints=hints)
    out = os.path.abspath(args.output)
    try:
        cross.export(ex, out, mode)
    except Exception as err:  # the linker's or the file system's complaint: one line
        raise RelaxTuneError(f"cannot write the library {args.output!r} ({error_line(err)}): "
                             "write to another file or folder") from None
    print(f"relax-tune: wrote {args.output}; tuned schedules for {tuned} of {len(tasks)} "
          f"tasks" + (f", predicted ones for {guessed}" if guessed else "")
          + ", the others keep their untuned code (no record, or none faster)")
    return 0


# ---------------------------------------------------------------------------- db
def _db_target(args: argparse.Namespace) -> dict | None:
    if getattr(args, "target", None) is None:
        return None
    return json.loads(str(parse_target(_target_arg(args.target))))


def _db_show(args: argparse.Namespace) -> int:
    from ..report import format_table, summarize

    work_dir = WorkDir.of(args.work_dir)
    db = work_dir.open_existing()
    summaries = summarize(db, work_dir.read_task_meta(), _db_target(args))
    print(f"{args.work_dir}: {len(summaries)} workloads, {len(db)} records")
    print(format_table(summaries))
    return 0


def _db_merge(args: argparse.Namespace) -> int:
    from .db_tools import merge_databases

    sources = [WorkDir.of(d) for d in args.sources]
    output = WorkDir.of(args.output)
    dest = output.open_database()
    added = merge_databases([src.open_existing() for src in sources], dest)
    _merge_meta(sources, output)
    print(f"relax-tune: merged {len(args.sources)} databases into {args.output}: {added} "
          f"records added, {len(dest)} in all")
    return 0


def _merge_meta(sources: "list[WorkDir]", output: "WorkDir") -> None:
    """Carry tasks.json (task names and weights) over to a merged or pruned work_dir."""
    meta: dict[int, dict] = {}
    for src in sources:
        meta.update(src.read_task_meta())
    if meta:
        output.write_meta({**output.read_task_meta(), **meta})


def _db_prune(args: argparse.Namespace) -> int:
    from .db_tools import prune_database

    work_dir, output = WorkDir.of(args.work_dir), WorkDir.of(args.output)
    if args.top_k < 1:  # before the output work_dir is made
        raise RelaxTuneError(f"--top-k must be at least 1, not {args.top_k}")
    if os.path.abspath(output.path) == os.path.abspath(work_dir.path):
        raise RelaxTuneError("prune writes a new work_dir: give -o a directory other than "
                             f"{args.work_dir!r} (the source is never modified)")
    source = work_dir.open_existing()
    dest = output.open_database()
    if len(dest):
        raise RelaxTuneError(f"{args.output!r} already holds {len(dest)} records: prune into "
                             "an empty or new directory")
    written = prune_database(source, dest, top_k=args.top_k,
                             keep_baseline=not args.drop_baseline)
    _merge_meta([work_dir], output)
    print(f"relax-tune: kept {written} of {len(source)} records (top {args.top_k} per "
          f"workload{'' if args.drop_baseline else ' + untuned baseline'}) in {args.output}")
    return 0


def _db_export(args: argparse.Namespace) -> int:
    from .db_tools import export_database

    work_dir = WorkDir.of(args.work_dir)
    check_output_file(args.output, "the export file -o", work_dir.own_files(),
                      f"a file of the work dir {args.work_dir!r}")
    fmt = args.format or ("csv" if args.output.lower().endswith(".csv") else "json")
    n = export_database(work_dir.open_existing(), args.output, fmt, work_dir.read_task_meta())
    what = "workloads (best schedule each)" if fmt == "json" else "records"
    print(f"relax-tune: exported {n} {what} to {args.output}")
    return 0


# ---------------------------------------------------------------------------- report, demo
def _report(args: argparse.Namespace) -> int:
    from ..report import task_meta_from_tasks, write_report

    meta = None
    if args.model:
        from ..tuning.extract import extract_tasks
        from ..model_loader import load_model

        target = parse_target(_target_arg(args.target))
        meta = task_meta_from_tasks(extract_tasks(load_model(args.model).lowered(target),
                                                  target))
    try:
        files = write_report(WorkDir.of(args.work_dir), args.output, meta=meta,
                             target=_db_target(args) if args.target and not args.model
                             else None, html_too=args.html)
    except OSError as err:  # a file of the report that cannot be written
        raise RelaxTuneError(f"cannot write the report ({err.strerror or err}: "
                             f"{err.filename}): give another folder with -o") from None
    from ..report import curve_lines

    for line in curve_lines(files.curve):
        print(line)
    for path in files.summary + files.plots:
        print(path)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo
    from ..utils import ensure_tvm_threads

    # the model is timed in this process: on the threads its kernels were tuned on
    ensure_tvm_threads()
    result = run_demo(args.work_dir, max_trials_global=args.trials,
                      target=_target_arg(args.target))
    return 0 if result["outputs_match"] else 1


# ---------------------------------------------------------------------------- parser
def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help=_MODEL_HELP)
    p.add_argument("--target", default=None, help=_TARGET_HELP)
    p.add_argument("--input-shape", action="append", metavar="NAME=D0,D1,...",
                   help="fix a symbolic input shape of an ONNX model (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``relax-tune`` (one sub-command per job)."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog="relax-tune", formatter_class=fmt,
        description="Search-based auto-tuning for TVM Relax models.\n\n"
                    "  relax-tune tune model.onnx --work-dir work --trials 256\n"
                    "  relax-tune compile model.onnx --work-dir work -o model.so\n"
                    "  relax-tune report work\n"
                    "  relax-tune db show work")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log every tuning round to the terminal")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tune = sub.add_parser(
        "tune", help="tune a model's kernels and record them in a work dir",
        formatter_class=fmt,
        description="Extract the model's kernels (the TIR functions the relax_tune pipeline "
                    "would compile), search schedules for them on the target and record every "
                    "measurement in WORK_DIR's JSON database (MetaSchedule's layout).\n"
                    "Running again with the same work dir resumes: recorded trials count "
                    "against the budget and are never measured again. Ctrl-C stops with "
                    "everything measured so far kept. Logs go to WORK_DIR/logs.")
    _add_model_args(tune)
    tune.add_argument("--work-dir", required=True,
                      help="the session's directory: tuning database, cost model, logs, task "
                           "names (created if missing)")
    tune.add_argument("--trials", type=int, default=None,
                      help="trials shared by all tasks (max_trials_global; default: 64, or "
                           "no limit with --max-time)")
    tune.add_argument("--trials-per-task", type=int, default=None,
                      help="cap on one task's trials (default: --trials)")
    tune.add_argument("--trials-per-iter", type=int, default=None,
                      help="candidates measured per round of one task (default: 16)")
    tune.add_argument("--op-names", nargs="+", default=None, metavar="NAME",
                      help="tune only tasks whose name contains one of these strings "
                           "(space- or comma-separated), e.g. --op-names matmul conv2d")
    tune.add_argument("--max-time", type=float, default=None, metavar="SECONDS",
                      help="the session's wall-clock budget, untuned baselines and searches "
                           "included (the main knob: e.g. --max-time 60); tasks it leaves "
                           "unmeasured keep the pre-trained model's first choice")
    tune.add_argument("--scheduler", choices=["gradient", "round-robin"], default=None,
                      help="how trials are shared among tasks (default: the tuner's, gradient)")
    tune.add_argument("--strategy", default=None,
                      help="search strategy by name (default: the tuner's)")
    tune.add_argument("--seed", type=int, default=None, help="random seed of the search")
    tune.add_argument("--cost-model", default=None, metavar="NAME",
                      help="the model that ranks candidates: xgb-prior (default: pre-trained, "
                           "adapting to the session), xgb (learns from this session only), "
                           "random or none")
    tune.add_argument("--no-transfer", action="store_true",
                      help="do not start from the schedules of alike workloads (the work "
                           "dir's and the library shipped with relax_tune)")
    tune.add_argument("--dynamic", action="append", default=None, metavar="NAME=S1,S2,...",
                      help="sizes a symbolic dimension is tuned at, e.g. n=1,16,64,256,1024 "
                           "(SIZE:WEIGHT weighs a size; repeat for more variables); default: "
                           "1 and the powers of 4 up to the model's bound or 1024")
    tune.add_argument("--rpc", default=None, metavar="HOST:PORT:KEY",
                      help="measure on a remote device through a TVM RPC tracker at HOST:PORT "
                           "with device key KEY (give the device's --target)")
    tune.set_defaults(func=_tune)

    comp = sub.add_parser(
        "compile", help="compile a model with the tuned schedules into a shared library",
        description="Compile MODEL with the relax_tune pipeline, applying the best schedule "
                    "of every kernel found in WORK_DIR (nothing is tuned), and export the "
                    "Relax VM executable as a shared library: load it with "
                    "tvm.runtime.load_module(path) and relax.VirtualMachine(lib, tvm.cpu()).")
    _add_model_args(comp)
    comp.add_argument("--work-dir", required=True, help="the work dir `tune` wrote")
    comp.add_argument("--predict", action="store_true",
                      help="first give every kernel without a tuned record a schedule, timing "
                           "nothing: the closest alike workload's tuned one (the work dir's "
                           "or the shipped library's), else the one the pre-trained model "
                           "ranks first (seconds; kept in WORK_DIR/predicted, which may be "
                           "new)")
    comp.add_argument("--no-transfer", action="store_true",
                      help="with --predict: the model's first choice everywhere, no schedule "
                           "of an alike workload (the work dir's, the shipped library's)")
    comp.add_argument("--dynamic", action="append", default=None, metavar="NAME=S1,S2,...",
                      help="extra sizes of a symbolic dimension to look records up at (the "
                           "sizes `tune` used are found in the work dir)")
    comp.add_argument("-o", "--output", required=True,
                      help="library to write, e.g. model.so (for a --target of another "
                           "architecture linked by its <mtriple>-gcc), or model.tar: object "
                           "files the device links (tvm.runtime.load_module links a .tar)")
    comp.set_defaults(func=_compile)

    db = sub.add_parser("db", help="inspect, merge, prune or export tuning databases",
                        description="Work on the JSON databases of work dirs "
                                    "(database_workload.json + database_tuning_record.json).")
    dbsub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    show = dbsub.add_parser(
        "show", help="list workloads with trials, best latency and target",
        description="One line per workload: a readable name (the task name from tasks.json, "
                    "else derived from its blocks), output shape, weight, trials, failures, "
                    "untuned and best latency, speedup, GFLOP/s and the targets measured; "
                    "then the estimated end-to-end time.")
    show.add_argument("work_dir", metavar="WORK_DIR")
    show.add_argument("--target", default=None,
                      help="count only records made for a target compatible with this one")
    show.set_defaults(func=_db_show)
    merge = dbsub.add_parser(
        "merge", help="merge several work dirs into one",
        description="Append every record of the SOURCE work dirs, in order, to OUTPUT "
                    "(created when missing; may be one of the sources); records already there "
                    "(same workload, trace and target) are skipped.")
    merge.add_argument("sources", nargs="+", metavar="SOURCE")
    merge.add_argument("-o", "--output", required=True, help="work dir to merge into")
    merge.set_defaults(func=_db_merge)
    prune = dbsub.add_parser(
        "prune", help="keep only the top-k records per workload",
        description="Write to OUTPUT (a new work dir) the K fastest valid records of every "
                    "workload and its untuned baseline; failed records are dropped. WORK_DIR "
                    "is not modified.")
    prune.add_argument("work_dir", metavar="WORK_DIR")
    prune.add_argument("-o", "--output", required=True, help="new work dir for the result")
    prune.add_argument("--top-k", type=int, default=1, help="records kept per workload "
                                                            "(default: 1)")
    prune.add_argument("--drop-baseline", action="store_true",
                       help="drop the untuned-function records too")
    prune.set_defaults(func=_db_prune)
    export = dbsub.add_parser(
        "export", help="export best schedules (JSON) or every record (CSV)",
        description="JSON: one object per workload with its name, shape, trials, untuned and "
                    "best seconds, and the best trace. CSV: every record (workload, trial, "
                    "mean seconds, valid, target), for your own analysis.")
    export.add_argument("work_dir", metavar="WORK_DIR")
    export.add_argument("-o", "--output", required=True, help="file to write (.json or .csv)")
    export.add_argument("--format", choices=["json", "csv"], default=None,
                        help="default: from the output's extension, else json")
    export.set_defaults(func=_db_export)

    report = sub.add_parser(
        "report", help="plot best-so-far latency per task and write a summary",
        description="Write WORK_DIR/report/ (or -o): curves.png (all tasks), one "
                    "curve_<i>_<task>.png per task (best-so-far latency versus trial, every "
                    "trial as a dot, the untuned latency dashed), and summary.md with the "
                    "tasks, their best schedules and the estimated end-to-end time (sum of "
                    "weight x latency; weights from tasks.json or --model, else 1).")
    report.add_argument("work_dir", metavar="WORK_DIR")
    report.add_argument("-o", "--output", default=None, help="directory for the report files")
    report.add_argument("--model", default=None,
                        help="the tuned model (" + _MODEL_HELP + "), for task weights when "
                             "WORK_DIR has no tasks.json")
    report.add_argument("--target", default=None,
                        help="with --model: the target it was tuned for; alone: only records "
                             "made for a compatible target")
    report.add_argument("--html", action="store_true", help="write summary.html too")
    report.set_defaults(func=_report)

    demo = sub.add_parser(
        "demo", help="tune the tutorial's MLP on this CPU and print what it gained",
        description="Tune the MetaSchedule tutorial's MLP (Linear-ReLU-Linear) on the host CPU, "
                    "print per task trials / best latency / speedup over the untuned function, "
                    "then the whole model's latency before and after. Re-running with the same "
                    "work dir resumes: trials already recorded count against the budget.")
    demo.add_argument("--work-dir", default="relax_tune_demo",
                      help="where the tuning database is kept (default: ./relax_tune_demo)")
    demo.add_argument("--trials", type=int, default=64,
                      help="trials shared by the model's tasks (default: 64)")
    demo.add_argument("--target", default=None, help=_TARGET_HELP)
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``relax-tune`` console script."""
    args = build_parser().parse_args(argv)
    # The level sits on the handler, not only the logger: tuning lowers the relax_tune
    # logger's level to feed work_dir/logs, and those records must not flood the terminal.
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.INFO if args.verbose else logging.WARNING)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > handler.level:
        root.setLevel(handler.level)
    restore_interrupts = handle_interrupts()
    try:
        return args.func(args)
    except RelaxTuneError as err:
        print(f"relax-tune: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside tuning (loading, compiling): nothing to keep
        print("\nrelax-tune: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        restore_interrupts()
        root.removeHandler(handler)


if __name__ == "__main__":
    sys.exit(main())
