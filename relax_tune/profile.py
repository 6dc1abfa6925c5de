"""Where a compiled model's time goes: each kernel timed in place, inside the whole model.

A tuned kernel is timed alone while tuning, its weights warm in cache between calls; in the
model its weights come from memory and every launch, layout change and allocation adds to
it, so the whole model can run well over the sum of its tuned kernels (issue 43: 1.3-1.6x
on a Zen 3). ``profile_model`` times every call the Relax VM makes (kernels and the VM's
builtins: allocation, reshape, ...) with the VM's instrument hook, over whole runs of the
model, and ``compare_with_tasks`` sets the in-model times against the tasks' measured ones.
With ``warm=True`` each kernel is also called a second time at once with the same arguments:
the gap between the two is what cold data costs it in the model (weights streamed from
memory, outputs written to lines not in cache). On the int8 ResNet-18 (Intel Xeon, 2
threads): 2.05 ms as called against 1.57 ms called again, the 7x7 and 14x14 convolutions
35-62% over their warm time (docs/results/int8-intel.md, session 9).

The hook adds a Python call before and after each VM call (about a microsecond each), so
the profile's total runs a little over the uninstrumented model: time the model alone for
its latency.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax


@dataclass
class KernelTime:
    """One function the VM calls: how often per run, and its seconds per run (all its
    calls together), medians over the profiled runs."""

    name: str
    calls: int
    secs: float
    warm_secs: float | None = None  # the same calls repeated at once (``warm=True``)


def profile_model(executable: Any, args: Sequence[Any], func_name: str = "main",
                  runs: int = 10, warmup: int = 3, device: Any = None,
                  warm: bool = False) -> list[KernelTime]:
    """Time every call of ``func_name`` of ``executable`` (a ``tvm.compile``d Relax module)
    in place over ``runs`` whole runs on ``args`` (numpy arrays or TVM tensors), after
    ``warmup`` uninstrumented runs. Returns one ``KernelTime`` per called function, slowest
    first. With ``warm``, each kernel (not the VM's builtins) is called again at once with
    the same arguments and timed (``warm_secs``); an in-place kernel then runs twice, so the
    profiled runs' results are not the model's."""
    dev = device or tvm.cpu()
    vm = relax.VirtualMachine(executable, dev)
    args = [a if isinstance(a, tvm.runtime.Tensor) else tvm.runtime.tensor(a, dev)
            for a in args]
    for _ in range(warmup):
        vm[func_name](*args)
    per_run: dict[str, list[float]] = defaultdict(list)
    warm_per_run: dict[str, list[float]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    started: list[float] = []
    this_run: dict[str, float] = defaultdict(float)
    this_warm: dict[str, float] = defaultdict(float)

    def instrument(func, name, before_run, ret_value, *call_args):  # noqa: ARG001
        if before_run:
            started.append(time.perf_counter())
        else:
            this_run[str(name)] += time.perf_counter() - started.pop()
            counts[str(name)] += 1
            if warm and not str(name).startswith("vm.builtin"):
                start = time.perf_counter()
                func(*call_args)
                this_warm[str(name)] += time.perf_counter() - start
        return 0  # VMInstrumentReturnKind.NO_OP: the call runs as usual

    vm.set_instrument(instrument)
    for _ in range(runs):
        this_run.clear()
        this_warm.clear()
        vm[func_name](*args)
        for name, secs in this_run.items():
            per_run[name].append(secs)
        for name, secs in this_warm.items():
            warm_per_run[name].append(secs)
    out = [KernelTime(name, counts[name] // runs, _median(secs + [0.0] * (runs - len(secs))),
                      _median(warm_per_run[name]) if warm_per_run.get(name) else None)
           for name, secs in per_run.items()]
    return sorted(out, key=lambda k: -k.secs)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def base_name(kernel: str) -> str:
    """A kernel's task name: the VM calls prepacked kernels ``<task>_prepacked``."""
    return kernel[:-len("_prepacked")] if kernel.endswith("_prepacked") else kernel


def compare_with_tasks(profile: Sequence[KernelTime], task_secs: dict[str, float]
                       ) -> list[tuple[str, int, float, float | None]]:
    """``(kernel, calls, in-model secs per run, measured secs per run or None)`` per
    profiled kernel, slowest in the model first: ``task_secs`` maps a task name to its
    measured seconds per call (a tuning table's best), multiplied here by the calls."""
    rows = []
    for k in profile:
        alone = task_secs.get(base_name(k.name))
        rows.append((k.name, k.calls, k.secs, None if alone is None else alone * k.calls))
    return rows
