"""What tuning produced, for people to read, per workload of a work_dir
(``WorkloadSummary``: best-so-far curves, plots, Markdown/HTML). A session's own per-task
report and tuning table are the tuning loop's (``relax_tune.tuning.state.TaskReport``,
``relax_tune.tuning.progress.format_tuning_table``); ``AppliedLatency`` is what both kinds
of row share: what ``ApplyDatabase`` will run and its speedup.

The database alone says, per workload, every measured trace in the order it was measured (the
record file is append-only, so file order is trial order) and the untuned function's time (the
empty-trace baseline record). It does not store task names or weights: every tuning entry
point writes them to ``work_dir/tasks.json`` (``WorkDir.write_task_meta``); without that file
names are derived from the workload's blocks and weights are unknown (counted as 1).

    wd = WorkDir.of(path)
    summaries = summarize(wd.open_existing(), wd.read_task_meta())
    paths = write_report(wd)          # curves.png, one curve_*.png per task, summary.md

Plots use matplotlib (a dependency); should it fail to import, the summary is still written
and the plots are skipped with a warning.
"""

from __future__ import annotations

import html
import json
import logging
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tvm
import tvm_ffi
from tvm.s_tir import analysis as s_analysis

from .database import Database, TuningRecord, Workload, is_baseline
from .tuning.state import AppliedLatency
from .tuning.timeline import curve_at, model_curve, read_timeline
from .paths import ensure_output_dir
from .utils import target_compatible
from .work_dir import WorkDir

logger = logging.getLogger("relax_tune.report")


# ---------------------------------------------------------------------------- a work_dir
@dataclass
class WorkloadSummary(AppliedLatency):
    """What the database knows about one workload: its trials in order and the best of them.

    ``curve[i]`` is the best valid latency (seconds) after trial ``i + 1`` (None before the
    first valid trial); ``trial_secs[i]`` the latency of trial ``i + 1`` (None if it failed).
    ``weight`` is None when unknown (no task metadata).
    """

    index: int
    name: str
    shash: int
    shape: str
    flops: float
    weight: int | None = None
    targets: list[str] = field(default_factory=list)
    trials: int = 0
    failures: int = 0
    baseline_secs: float | None = None
    best_secs: float | None = None
    best_record: TuningRecord | None = None
    curve: list[float | None] = field(default_factory=list)
    trial_secs: list[float | None] = field(default_factory=list)

    @property
    def gflops(self) -> float | None:
        """Throughput of the applied schedule in GFLOP/s."""
        return self.flops / self.applied_secs / 1e9 if self.flops and self.applied_secs else None

    @property
    def effective_weight(self) -> int:
        """The weight, or 1 when it is unknown."""
        return 1 if self.weight is None else self.weight


# ---------------------------------------------------------------------------- names, metadata
def block_names(mod: tvm.IRModule) -> list[str]:
    """The names of the blocks of a workload's ``main`` function, in execution order."""
    names: list[str] = []
    func = mod["main"]
    tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, lambda b: names.append(b.name_hint))])
    return [n for n in names if n != "root"]


def workload_name(mod: tvm.IRModule) -> str:
    """A readable name for a workload from its block names, e.g. ``matmul_add_compute``
    (``T_`` prefixes and numeric suffixes dropped, repeats removed)."""
    parts: list[str] = []
    for name in block_names(mod):
        part = re.sub(r"_\d+$", "", re.sub(r"^T_", "", name))
        if part and part not in parts:
            parts.append(part)
    return "_".join(parts[:4]) or "main"


def output_shape(mod: tvm.IRModule) -> str:
    """The shape of the workload's last parameter (its output by TVM's convention), ``1x256``."""
    params = mod["main"].params
    shape = getattr(params[-1], "shape", None) if params else None
    if shape is None:
        return "-"
    return "x".join(str(int(d)) if isinstance(d, (int, tvm.tirx.IntImm)) else str(d)
                    for d in shape) or "scalar"


def workload_flops(mod: tvm.IRModule) -> float:
    """Estimated FLOPs of one call of the workload (0 when TVM cannot estimate them)."""
    try:
        return float(s_analysis.estimate_tir_flops(mod))
    except Exception:  # estimate_tir_flops rejects some opaque functions; display only
        return 0.0


def task_meta_from_tasks(tasks: Iterable[Any]) -> dict[int, dict]:
    """Task metadata (as ``read_task_meta``) from ``Task`` objects."""
    return {int(t.shash): {"name": t.task_name, "weight": int(t.weight)} for t in tasks}


def short_target(config: dict | None) -> str:
    """A target dict as ``llvm -mcpu=znver3 -num-cores=2`` (``any`` for None)."""
    if not config:
        return "any"
    parts = [str(config.get("kind", "?"))]
    for key in ("mcpu", "mtriple", "mattr", "arch", "num-cores"):
        if key in config:
            value = config[key]
            value = ",".join(map(str, value)) if isinstance(value, list) else value
            parts.append(f"-{key}={value}")
    return " ".join(parts)


# ---------------------------------------------------------------------------- summaries
def summarize(db: Database, meta: dict[int, dict] | None = None,
              target: dict | None = None) -> list[WorkloadSummary]:
    """One ``WorkloadSummary`` per workload of ``db`` (in the database's order), from its
    records in commit order; with ``target``, only records made for a compatible target."""
    meta = meta or {}
    out: list[WorkloadSummary] = []
    for index, workload in enumerate(db.get_all_workloads()):
        info = meta.get(int(workload.shash)) or meta.get(_plain_hash(workload)) or {}
        summary = WorkloadSummary(
            index=index, name=str(info.get("name") or workload_name(workload.mod)),
            shash=int(workload.shash), shape=output_shape(workload.mod),
            flops=workload_flops(workload.mod), weight=info.get("weight"))
        _add_records(summary, db.get_records(workload), target)
        out.append(summary)
    return out


def _plain_hash(workload: Workload) -> int:
    # tasks.json holds utils.structural_hash; a database with another module equality
    # stores a different hash for the same module
    from .utils import structural_hash

    return structural_hash(workload.mod)


def _add_records(summary: WorkloadSummary, records: Sequence[TuningRecord],
                 target: dict | None) -> None:
    best: float | None = None
    for rec in records:
        if target is not None and not target_compatible(rec.target_config, target):
            continue
        name = short_target(rec.target_config)
        if name not in summary.targets:
            summary.targets.append(name)
        secs = rec.mean_run_secs if rec.is_valid else None
        if is_baseline(rec):
            if secs is not None:
                summary.baseline_secs = secs if summary.baseline_secs is None \
                    else min(summary.baseline_secs, secs)
            continue
        summary.trials += 1
        summary.trial_secs.append(secs)
        if secs is None:
            summary.failures += 1
        elif best is None or secs < best:
            best = secs
            summary.best_record = rec
        summary.curve.append(best)
    summary.best_secs = best


def end_to_end(summaries: Sequence[WorkloadSummary]) -> tuple[float | None, float | None]:
    """Estimated model latency ``(untuned, tuned)``: sums of weight x latency over the tasks
    (a task's weight counts as 1 when unknown); None when a task has no time at all."""
    untuned = [s.effective_weight * s.baseline_secs for s in summaries if s.baseline_secs]
    tuned = [s.effective_weight * s.applied_secs for s in summaries if s.applied_secs]
    complete_untuned = len(untuned) == len(summaries)
    complete_tuned = len(tuned) == len(summaries)
    return (sum(untuned) if complete_untuned and untuned else None,
            sum(tuned) if complete_tuned and tuned else None)


def format_table(summaries: Sequence[WorkloadSummary]) -> str:
    """The plain-text workload table ``relax-tune db show`` prints."""
    head = (f"{'#':>3} {'workload':<28}{'shape':>12}{'weight':>7}{'trials':>7}{'failed':>7}"
            f"{'untuned us':>12}{'best us':>10}{'speedup':>9}{'GFLOP/s':>9}  target")
    lines = [head, "-" * (len(head) + 20)]
    for s in summaries:
        lines.append(
            f"{s.index:>3} {s.name[:27]:<28}{s.shape[:11]:>12}"
            f"{'?' if s.weight is None else s.weight:>7}{s.trials:>7}{s.failures:>7}"
            f"{_us(s.baseline_secs):>12}{_us(s.best_secs):>10}"
            f"{(f'{s.speedup:.2f}x' if s.speedup else '-'):>9}"
            f"{(f'{s.gflops:.2f}' if s.gflops else '-'):>9}  {', '.join(s.targets) or '-'}")
    untuned, tuned = end_to_end(summaries)
    weights = "weights unknown, counted as 1" if any(s.weight is None for s in summaries) \
        else "weights from tasks.json"
    if tuned is not None:
        lines.append(f"estimated end-to-end: {_us(tuned)} us tuned"
                     + (f", {_us(untuned)} us untuned ({untuned / tuned:.2f}x)" if untuned else "")
                     + f" ({weights})")
    return "\n".join(lines)


def _us(secs: float | None) -> str:
    return f"{secs * 1e6:.2f}" if secs else "-"


# ---------------------------------------------------------------------------- plots
def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _draw_curve(ax, s: WorkloadSummary) -> None:
    trials = list(range(1, s.trials + 1))
    ok = [(t, x * 1e6) for t, x in zip(trials, s.trial_secs) if x is not None]
    if ok:
        ax.scatter([t for t, _ in ok], [x for _, x in ok], s=8, color="0.7", label="trial",
                   zorder=1)
    curve = [(t, x * 1e6) for t, x in zip(trials, s.curve) if x is not None]
    if curve:
        ax.step([t for t, _ in curve], [x for _, x in curve], where="post", color="C0",
                linewidth=2, label="best so far", zorder=3,
                marker="o" if len(curve) == 1 else None)  # one point draws no step
    if s.baseline_secs:
        ax.axhline(s.baseline_secs * 1e6, color="C3", linestyle="--", linewidth=1.2,
                   label=f"untuned {_us(s.baseline_secs)} us", zorder=2)
    values = [x for _, x in ok] + ([s.baseline_secs * 1e6] if s.baseline_secs else [])
    if values and max(values) / max(min(values), 1e-12) > 20:
        ax.set_yscale("log")  # failed-looking outliers would flatten the curve otherwise
    best = f"best {_us(s.best_secs)} us" if s.best_secs else "no valid trial"
    ax.set_title(f"#{s.index} {s.name} [{s.shape}]\n{s.trials} trials, {best}", fontsize=9)
    ax.set_xlabel("trial")
    ax.set_ylabel("latency (us)")
    ax.grid(True, alpha=0.3)
    if s.trials:
        ax.set_xlim(0, s.trials + 1)
        ax.xaxis.get_major_locator().set_params(integer=True)
    else:
        ax.text(0.5, 0.3, "no tuning trials", transform=ax.transAxes, ha="center",
                va="center", color="0.4")
        ax.set_xlim(0, 1)
    if ok or s.baseline_secs:
        ax.legend(fontsize=7, loc="upper right")


def plot_curves(summaries: Sequence[WorkloadSummary], out_dir: str) -> list[str]:
    """Write ``curves.png`` (every workload, one subplot each) and ``curve_<i>_<name>.png`` per
    workload into ``out_dir``: best-so-far latency versus trial, each trial as a grey dot, the
    untuned latency dashed. Returns the paths ([] without matplotlib, with a warning)."""
    plt = _pyplot()
    if plt is None:
        logger.warning("plots skipped: matplotlib is not installed (pip install "
                       "'relax_tune[plot]')")
        return []
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    if summaries:
        cols = min(3, len(summaries))
        rows = math.ceil(len(summaries) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
        for ax, s in zip(axes.flat, summaries):
            _draw_curve(ax, s)
        for ax in list(axes.flat)[len(summaries):]:
            ax.set_visible(False)
        fig.suptitle("relax_tune: best-so-far latency per workload")
        fig.tight_layout()
        path = os.path.join(out_dir, "curves.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    for s in summaries:
        fig, ax = plt.subplots(figsize=(6, 4))
        _draw_curve(ax, s)
        fig.tight_layout()
        path = os.path.join(out_dir, curve_file_name(s))
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def curve_file_name(s: WorkloadSummary) -> str:
    """The per-workload plot's file name, ``curve_<index>_<name>.png``."""
    return f"curve_{s.index}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', s.name)[:60]}.png"


# ---------------------------------------------------------------------------- summary files
def best_schedule_text(s: WorkloadSummary) -> str:
    """The best record's schedule as Python (``sch.split(...)``...), or why there is none."""
    rec = s.best_record
    if rec is None:
        return "(no valid tuned schedule)"
    if is_baseline(rec):
        return "(the untuned function)"
    if rec.check_trace() is None:
        return str(rec.trace)
    return json.dumps(rec.trace_json)


CURVE_MARKS = (0, 30, 60, 120, 300)
"""Tuning seconds the curve table reads the model's estimate at (and the curve's end)."""


def curve_lines(curve: Sequence[tuple[float, float, int]]) -> list[str]:
    """The model's estimated latency against tuning seconds as Markdown lines (the curve
    of ``tuning.timeline.model_curve``), read at ``CURVE_MARKS`` and at its end."""
    if not curve:
        return []
    end = curve[-1][0]
    marks = [m for m in CURVE_MARKS if m <= end] + [end]
    start = curve[0][1]
    lines = [f"Estimated model latency against tuning seconds ({curve[-1][2]} tasks measured; "
             "a task counts with its first measured time until it was measured: 0 s is "
             "close to the no-measurement compile).", "",
             "| tuning s | estimated us | vs 0 s |", "|---:|---:|---:|"]
    for mark in dict.fromkeys(marks):
        est = curve_at(list(curve), mark)
        lines.append(f"| {mark:.0f} | {_us(est)} | {start / est:.2f}x |")
    return lines + [""]


def plot_model_curve(curve: Sequence[tuple[float, float, int]], out_dir: str) -> list[str]:
    """``model_curve.png``: the estimated model latency against tuning seconds (a step
    plot); [] without matplotlib or a curve."""
    plt = _pyplot() if curve else None
    if plt is None:
        return []
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step([t for t, _, _ in curve], [e * 1e6 for _, e, _ in curve], where="post")
    ax.set_xlabel("tuning seconds")
    ax.set_ylabel("estimated model latency (us)")
    ax.set_title("the model against tuning time")
    ax.grid(alpha=0.3)
    path = os.path.join(out_dir, "model_curve.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]


def summary_markdown(summaries: Sequence[WorkloadSummary], work_dir: str,
                     plot_files: dict[int, str] | None = None, overview: str | None = None,
                     curve: Sequence[tuple[float, float, int]] = (),
                     curve_plot: bool = False) -> str:
    """The report as Markdown: the workload table, the estimated end-to-end time, the model's
    curve against tuning seconds, and per workload its plot and best schedule."""
    plot_files = plot_files or {}
    untuned, tuned = end_to_end(summaries)
    weights_known = all(s.weight is not None for s in summaries)
    n_records = sum(s.trials for s in summaries)
    lines = [f"# relax_tune report: `{work_dir}`", "",
             f"{len(summaries)} workloads, {n_records} trials "
             f"({sum(s.failures for s in summaries)} failed).", ""]
    if tuned is not None:
        est = f"**Estimated end-to-end time: {_us(tuned)} us tuned**"
        if untuned:
            est += f", {_us(untuned)} us untuned ({untuned / tuned:.2f}x faster)"
        lines.append(est + " — the sum over tasks of weight x latency "
                     + ("(weights from tasks.json)." if weights_known
                        else "(weights unknown: each task counted once)."))
        lines.append("")
    lines += curve_lines(curve)
    if curve_plot:
        lines += ["![estimated model latency against tuning seconds](model_curve.png)", ""]
    if overview:
        lines += [f"![best-so-far latency per workload]({overview})", ""]
    lines += ["| # | workload | shape | weight | trials | failed | untuned us | best us | "
              "speedup | GFLOP/s | weighted us | target |",
              "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in summaries:
        weighted = s.applied_secs * s.effective_weight if s.applied_secs else None
        lines.append(
            f"| {s.index} | {s.name} | {s.shape} | {'?' if s.weight is None else s.weight} | "
            f"{s.trials} | {s.failures} | {_us(s.baseline_secs)} | {_us(s.best_secs)} | "
            f"{f'{s.speedup:.2f}x' if s.speedup else '-'} | "
            f"{f'{s.gflops:.2f}' if s.gflops else '-'} | {_us(weighted)} | "
            f"{', '.join(s.targets) or '-'} |")
    lines.append("")
    for s in summaries:
        lines += [f"## #{s.index} {s.name} [{s.shape}]", "",
                  f"structural hash `{s.shash}`; {s.trials} trials, best "
                  f"{_us(s.best_secs)} us, untuned {_us(s.baseline_secs)} us.", ""]
        if s.index in plot_files:
            lines += [f"![{s.name}]({plot_files[s.index]})", ""]
        lines += ["Best schedule:", "", "```python", best_schedule_text(s), "```", ""]
    return "\n".join(lines)


def summary_html(summaries: Sequence[WorkloadSummary], work_dir: str,
                 plot_files: dict[int, str] | None = None, overview: str | None = None) -> str:
    """The report as one self-contained-text HTML page (plots linked as files)."""
    plot_files = plot_files or {}
    esc = html.escape
    untuned, tuned = end_to_end(summaries)
    rows = []
    for s in summaries:
        weighted = s.applied_secs * s.effective_weight if s.applied_secs else None
        cells = [s.index, s.name, s.shape, "?" if s.weight is None else s.weight, s.trials,
                 s.failures, _us(s.baseline_secs), _us(s.best_secs),
                 f"{s.speedup:.2f}x" if s.speedup else "-",
                 f"{s.gflops:.2f}" if s.gflops else "-", _us(weighted),
                 ", ".join(s.targets) or "-"]
        rows.append("<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in cells) + "</tr>")
    head = ["#", "workload", "shape", "weight", "trials", "failed", "untuned us", "best us",
            "speedup", "GFLOP/s", "weighted us", "target"]
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>relax_tune report</title>"
             "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}"
             "pre{background:#f6f6f6;padding:8px;overflow:auto}</style></head><body>",
             f"<h1>relax_tune report: <code>{esc(work_dir)}</code></h1>"]
    if tuned is not None:
        parts.append(f"<p><b>Estimated end-to-end time: {_us(tuned)} us tuned</b>"
                     + (f", {_us(untuned)} us untuned ({untuned / tuned:.2f}x)" if untuned else "")
                     + (" (weights from tasks.json)" if all(s.weight is not None
                                                            for s in summaries)
                        else " (weights unknown: each task counted once)") + "</p>")
    if overview:
        parts.append(f"<img src='{esc(overview)}' alt='curves'>")
    parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
                 + "".join(rows) + "</table>")
    for s in summaries:
        parts.append(f"<h2>#{s.index} {esc(s.name)} [{esc(s.shape)}]</h2>")
        if s.index in plot_files:
            parts.append(f"<img src='{esc(plot_files[s.index])}' alt='{esc(s.name)}'>")
        parts.append(f"<pre>{esc(best_schedule_text(s))}</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


@dataclass
class ReportFiles:
    """What ``write_report`` wrote: the summary file(s) and the plots."""

    summary: list[str]
    plots: list[str]
    summaries: list[WorkloadSummary]
    curve: list[tuple[float, float, int]] = field(default_factory=list)
    """The model's estimated latency against tuning seconds (``timeline.model_curve``)."""


def write_report(work_dir: WorkDir | str, out_dir: str | None = None,
                 meta: dict[int, dict] | None = None, target: dict | None = None,
                 html_too: bool = False) -> ReportFiles:
    """Write the report of ``work_dir`` into ``out_dir`` (default ``work_dir/report``):
    ``curves.png``, ``curve_<i>_<name>.png`` per workload and ``summary.md`` (plus
    ``summary.html`` with ``html_too``). ``meta`` defaults to ``work_dir/tasks.json``."""
    wd = WorkDir.of(work_dir)
    summaries = summarize(wd.open_existing(), wd.read_task_meta() if meta is None else meta,
                          target)
    out_dir = out_dir or wd.file("report")
    ensure_output_dir(out_dir, "the report folder",
                      "give another folder for the report (relax-tune report -o DIR)")
    curve = model_curve(read_timeline(wd.timeline_file))
    plots = plot_model_curve(curve, out_dir) + plot_curves(summaries, out_dir)
    names = {os.path.basename(p) for p in plots}
    plot_files = {s.index: curve_file_name(s) for s in summaries if curve_file_name(s) in names}
    overview = "curves.png" if "curves.png" in names else None
    written = []
    path = os.path.join(out_dir, "summary.md")
    with open(path, "w", encoding="utf-8") as file:
        file.write(summary_markdown(summaries, work_dir, plot_files, overview, curve,
                                    "model_curve.png" in names))
    written.append(path)
    if html_too:
        path = os.path.join(out_dir, "summary.html")
        with open(path, "w", encoding="utf-8") as file:
            file.write(summary_html(summaries, work_dir, plot_files, overview))
        written.append(path)
    return ReportFiles(written, plots, summaries, list(curve))
