"""Interleaved re-timing for the benchmarks: every contender is timed once per round, round
after round, so that all of them see the same spells of this machine's drifting speed.

The development box's speed drifts by 20-40% over seconds to minutes (the same library times
1.27 ms, then 1.50 ms a minute later). Timing numpy at the start of a run and a tuned kernel
ten minutes later compares two spells, not two kernels. Here each round times every
contender back to back; a contender's figure is its median over rounds, and its ratio to the
reference is the median of the per-round ratios.

Before each timing the process sleeps ``pause`` seconds: numpy's OpenBLAS threads spin for
about 0.1 s after a call (``OPENBLAS_THREAD_TIMEOUT``, 2^28 cycles), and a TVM kernel timed
while they spin gets one of the two cores: measured here, a 1.3 ms conv2d timed 2.5-3.5 ms
right after numpy, and numpy 20-40 ms instead of 12 right after TVM.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import tvm

from relax_tune.measure.prepack import packed_kernel


def numpy_timer(fn: Callable[[], object], calls: int = 5) -> Callable[[], float]:
    """A timer for a Python callable: median wall time of ``calls`` calls (after one warm-up
    call the first time)."""
    fn()

    def once() -> float:
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return float(np.median(times))

    return once


def kernel_timer(lib: tvm.runtime.Module, args: list, min_secs: float = 0.05,
                 repeat: int = 1) -> Callable[[], float]:
    """A timer for ``lib["main"](*args)``: the mean of as many calls as fill ``min_secs``
    (at least one), through the runtime's time evaluator; with ``repeat`` > 1 the calls are
    split in that many repeats and the fastest repeat counts (as in ``head_to_head``: other
    work only adds time; a ~50 us kernel timed against itself in interleaved rounds came
    out 1.06-1.23x by means, 0.98-0.99x by fastest of 5 repeats, Zen 4)."""
    dev = tvm.cpu()
    start = time.perf_counter()
    lib["main"](*args)
    once_secs = time.perf_counter() - start
    number = max(1, int(min_secs / repeat / max(once_secs, 1e-6)))
    evaluator = lib.time_evaluator("main", dev, number=number, repeat=repeat)
    return lambda: float(min(evaluator(*args).results))


def trace_timer(mod: tvm.IRModule, trace: list, target, args: list, min_secs: float = 0.05,
                repeat: int = 1) -> Callable[[], float]:
    """``kernel_timer`` of the kernel a tuning record's ``trace`` makes of ``mod``
    (``packed_kernel``: packed weights packed once)."""
    from relax_tune.utils import schedule_from_json

    lib, packed = packed_kernel(schedule_from_json(mod, trace).mod, target, args)
    return kernel_timer(lib, packed, min_secs, repeat)


def interleaved(timers: dict[str, Callable[[], float]], reference: str, rounds: int = 7,
                pause: float = 0.3) -> dict[str, tuple[float, float]]:
    """Time every timer once per round for ``rounds`` rounds (the order rotates each
    round; ``pause`` seconds of sleep before each timing). Returns ``name -> (median secs,
    median per-round ratio reference / name)``: the ratio is the speed relative to the
    reference (above 1: faster)."""
    names = list(timers)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            time.sleep(pause)
            samples[name].append(timers[name]())
    ref = samples[reference]
    return {n: (float(np.median(s)), float(np.median([a / b for a, b in zip(ref, s)])))
            for n, s in samples.items()}
