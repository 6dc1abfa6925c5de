"""The demo: the tutorial's MLP tuned end to end on the host CPU, with a printed summary."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from .lowering import lower_for_tuning
from .tuning.extract import extract_tasks
from .tuning.state import TaskReport
from .tuning.tune import tune_tasks
from .utils import parse_target


def demo_model() -> tuple[tvm.IRModule, list]:
    """The MetaSchedule tutorial's MLP: Linear(784, 256) -> ReLU -> Linear(256, 10, bias=False),
    input (1, 784) float32, exported with ``export_tvm``; returns ``(mod, params)``."""
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self):
            self.fc1 = nn.Linear(784, 256)
            self.relu = nn.ReLU()
            self.fc2 = nn.Linear(256, 10, bias=False)

        def forward(self, x):
            return self.fc2(self.relu(self.fc1(x)))

    return MLP().export_tvm({"forward": {"x": nn.spec.Tensor((1, 784), "float32")}})


@dataclass
class ModelTiming:
    """Median per-call latency of a compiled model, and its output on the demo inputs."""

    median_secs: float
    output: np.ndarray


def time_model(mod: tvm.IRModule, target: tvm.target.Target, inputs: list[np.ndarray],
               func_name: str = "forward", number: int = 50, repeat: int = 7,
               relax_pipeline=None) -> ModelTiming:
    """Compile ``mod`` (already lowered to TIR calls, or raw with ``relax_pipeline`` given)
    and time one VM call on the CPU."""
    ex = tvm.compile(mod, target, relax_pipeline=relax_pipeline or "default")
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    output = vm[func_name](*args).numpy()
    timer = vm.time_evaluator(func_name, dev, number=number, repeat=repeat)
    return ModelTiming(float(np.median(timer(*args).results)), output)


def demo_inputs(params: list, seed: int = 0) -> list[np.ndarray]:
    """Seeded input and weights for the demo model (input first, then params in order)."""
    rng = np.random.default_rng(seed)
    shapes = [(1, 784)] + [tuple(int(d) for d in p.shape) for _, p in params]
    return [rng.uniform(-1, 1, s).astype("float32") for s in shapes]


def format_task_table(reports: list[TaskReport]) -> str:
    """The per-task table: trials, untuned and best tuned latency, GFLOP/s, what is applied
    and its speedup over the untuned function."""
    head = f"{'task':<26}{'weight':>7}{'trials':>8}{'failed':>8}{'untuned us':>12}" \
           f"{'best us':>10}{'GFLOP/s':>9}{'applied':>9}{'speedup':>9}"
    lines = [head, "-" * len(head)]
    for r in reports:
        def us(x):
            return f"{x * 1e6:.2f}" if x else "n/a"
        gf = f"{r.gflops:.2f}" if r.gflops else "n/a"
        up = f"{r.speedup:.2f}x" if r.speedup else "n/a"
        lines.append(f"{r.task_name:<26}{r.weight:>7}{r.trials:>8}{r.failures:>8}"
                     f"{us(r.baseline_secs):>12}{us(r.best_secs):>10}{gf:>9}"
                     f"{'tuned' if r.tuned_applied else 'untuned':>9}{up:>9}")
    return "\n".join(lines)


def run_demo(work_dir: str, max_trials_global: int = 64, target=None,
             num_trials_per_iter: int = 16, out=print) -> dict:
    """Tune the demo model in ``work_dir`` and print per-task results, then the model latency
    before (untuned, weights as inputs, as exported) and after (the "relax_tune" pipeline with
    the weights bound, so weight transposes are folded at compile time) next to the sum of
    the tuned kernels; the difference is the per-call overhead (VM, kernel launches).
    Returns the figures as a dict (also used by the tests)."""
    target = parse_target(target)
    mod, params = demo_model()
    inputs = demo_inputs(params)
    weights = {name: arr for (name, _), arr in zip(params, inputs[1:])}
    with target:
        untuned = relax.get_pipeline("zero")(mod)
    lowered = lower_for_tuning(mod, target, weights)  # as the pipeline lowers it with params
    tasks = extract_tasks(lowered, target)
    out(f"relax_tune demo: {len(tasks)} tasks "
        f"({', '.join(t.task_name for t in tasks)}) on {target}; weights bound, so the "
        f"weight transposes are folded at compile time and not tuned, and on CPU the "
        f"weights are packed in the layouts the tuned kernels read")
    out(f"tuning with max_trials_global={max_trials_global}, work_dir={work_dir} ...")
    start = time.perf_counter()
    reports = tune_tasks(tasks, work_dir, max_trials_global=max_trials_global,
                         num_trials_per_iter=num_trials_per_iter)
    wall = time.perf_counter() - start
    new = sum(r.new_trials for r in reports)
    out(f"tuned {new} new trials in {wall:.1f} s"
        + (f" ({sum(r.trials for r in reports) - new} resumed from work_dir)"
           if sum(r.trials for r in reports) > new else ""))
    out(format_task_table(reports))

    before = time_model(untuned, target, inputs)
    pipeline = relax.get_pipeline("relax_tune", target=target, work_dir=work_dir,
                                  max_trials_global=0, params=weights)
    after = time_model(mod, target, inputs[:1], relax_pipeline=pipeline)
    same = bool(np.allclose(before.output, after.output, rtol=1e-4, atol=1e-5))
    kernels = sum(r.applied_secs * r.weight for r in reports if r.applied_secs)
    out(f"model latency per call: untuned {before.median_secs * 1e6:.1f} us (weights as "
        f"inputs), tuned {after.median_secs * 1e6:.1f} us (weights bound) "
        f"({before.median_secs / after.median_secs:.2f}x)")
    out(f"sum of the tuned kernels {kernels * 1e6:.1f} us; per-call overhead (VM, launches) "
        f"{(after.median_secs - kernels) * 1e6:.1f} us; outputs match: {same}")
    return {"reports": reports, "before": before, "after": after, "outputs_match": same,
            "tune_secs": wall, "kernels_secs": kernels}
