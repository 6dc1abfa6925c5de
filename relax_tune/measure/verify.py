"""Correctness check: a candidate about to become its task's best must compute what the task's
baseline computes, on seeded random inputs. The baseline is what the builder builds for the
trace None: the untuned function, or on a GPU the target's default schedule
(``baseline.baseline_module``: an unbound function is no GPU kernel); below, "the untuned
function" means that program.

Design (why before committing): a database ranks valid records by mean run time, and
``ApplyDatabase`` takes the fastest one; a second record for the same trace would not hide the
first. So the check runs *before* the batch is committed: a candidate that would beat the
task's best is run once more (``runner.run_and_fetch``) and its outputs compared with the
untuned function's on the same inputs; a wrong one is committed as failed (``run_secs``
``[1e10]``, never applied) and the next fastest is checked instead. Every record that is ever
a task's best -- the final best included -- has passed the check, on disk, for every reader
(MetaSchedule's too).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..utils import structural_hash
from .base import Builder, MeasureError, Runner, RunResult, short_error

logger = logging.getLogger("relax_tune.measure.verify")

WRONG_RESULT = "wrong result"
"""Start of the error text of a candidate whose outputs differ from the untuned function's."""

ROUNDING_FLIPS = 0.01
"""Integer outputs may differ by one in at most this fraction of their elements. An integer
computed by rounding a float (a quantized output: dequantize, float epilogue, round, clip)
moves by one step where a float lands next to a rounding boundary and a vectorised or
reordered epilogue changes its last bit. Measured on a BERT-class int8 encoder's FFN kernel
(gelu epilogue): 176 of 131,072 uint8 outputs differed by one from the untuned function in
every candidate, so every candidate was recorded as wrong and the untuned function (140x
slower) stayed. A wrong schedule moves far more elements, or by more than one."""


def compare_outputs(got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-3,
                    atol: float = 1e-3) -> str | None:
    """None when every array of ``got`` matches ``want``, else what differs (first mismatch).

    Floats match within ``rtol`` and ``atol`` scaled by the reference's largest magnitude
    (sums over long reductions grow with their length; a different summation order shifts
    them slightly); NaN matches NaN. Integers match when at most ``ROUNDING_FLIPS`` of them
    differ, by one (rounding flips of a float epilogue). Other dtypes must be equal."""
    if len(got) != len(want):
        return f"{len(got)} arguments instead of {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return f"argument {i}: shape {g.shape} instead of {w.shape}"
        if w.dtype.kind in "fc":
            scale = float(np.nanmax(np.abs(w))) if w.size and not np.all(np.isnan(w)) else 1.0
            if not np.allclose(g, w, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True):
                diff = np.abs(g.astype(np.float64) - w.astype(np.float64))
                return (f"argument {i}: max abs difference {np.nanmax(diff):.3g} "
                        f"(reference magnitude {scale:.3g})")
        elif w.dtype.kind in "iu":
            diff = np.abs(g.astype(np.int64) - w.astype(np.int64))
            differ = int(np.count_nonzero(diff))
            if differ and (diff.max() > 1 or differ > ROUNDING_FLIPS * diff.size):
                return f"argument {i}: {differ} elements differ, by up to {int(diff.max())}"
        elif not np.array_equal(g, w):
            return f"argument {i}: {int(np.sum(g != w))} elements differ"
    return None


class CorrectnessChecker:
    """Checks candidates of tasks against their untuned functions (see the module doc).

    The untuned function of a task is built once with ``builder`` and its outputs fetched once
    with ``runner``, cached by the workload's structural hash (tasks of separately extracted
    modules share a name, "main": by the name alone six matmuls of 320-400 rows were checked
    against one's outputs, and every candidate of the others failed). A task whose untuned
    function cannot be built or run is not checked (logged once). ``seed`` picks the inputs
    (the same for both sides).
    """

    def __init__(self, builder: Builder, runner: Runner, seed: int = 7, rtol: float = 1e-3,
                 atol: float = 1e-3) -> None:
        if not runner.can_fetch:
            raise TypeError(f"{type(runner).__name__} cannot run_and_fetch: it cannot be used "
                            "to check results (pass check_correctness=False)")
        self.builder, self.runner = builder, runner
        self.seed, self.rtol, self.atol = int(seed), float(rtol), float(atol)
        self._reference: dict[int, list[np.ndarray] | None] = {}  # by structural hash
        self.checked = 0
        self.wrong = 0

    def reference(self, key: Any, mod: Any, target: Any, args_info: list
                  ) -> list[np.ndarray] | None:
        """The arguments after one call of the untuned ``mod`` (cached), or None."""
        cached = structural_hash(mod)
        if cached in self._reference:
            return self._reference[cached]
        ref = None
        build = self.builder.build(mod, target, [None])[0]
        if not build.ok:
            logger.warning("%s: the untuned function does not build (%s); its candidates are "
                           "not checked", key, build.error)
        else:
            try:
                ref = self.runner.run_and_fetch(build.artifact_path, args_info, target,
                                                seed=self.seed)
            except MeasureError as err:
                logger.warning("%s: the untuned function does not run (%s); its candidates "
                               "are not checked", key, err)
            self.builder.discard([build.artifact_path])
        self._reference[cached] = ref
        return ref

    def use_reference(self, key: Any, mod: Any, target: Any, args_info: list,
                      artifact: str) -> None:
        """Take the reference of ``key`` from ``artifact``, the untuned function built
        already (the tuner builds it with the task's first batch), instead of building it
        again; nothing changes when the reference is known or ``artifact`` fails to run (it
        is built and run again when first needed)."""
        cached = structural_hash(mod)
        if self._reference.get(cached) is not None:
            return
        try:
            self._reference[cached] = self.runner.run_and_fetch(artifact, args_info, target,
                                                              seed=self.seed)
        except MeasureError as err:
            logger.debug("%s: the untuned function's outputs: %s", key, err)

    def check(self, key: Any, mod: Any, target: Any, args_info: list,
              artifact: str) -> str | None:
        """None when ``artifact`` computes what the untuned ``mod`` computes (or nothing can be
        compared), else the error text to record (``"wrong result: ..."`` or why it failed)."""
        ref = self.reference(key, mod, target, args_info)
        if ref is None:
            return None
        self.checked += 1
        try:
            got = self.runner.run_and_fetch(artifact, args_info, target, seed=self.seed)
        except MeasureError as err:
            self.wrong += 1
            return f"failed when checked: {short_error(str(err))}"
        diff = compare_outputs(got, ref, self.rtol, self.atol)
        if diff is None:
            return None
        self.wrong += 1
        return f"{WRONG_RESULT}: {diff}"

    def screen(self, key: Any, mod: Any, target: Any, args_info: list,
               artifacts: list[str | None], runs: list[RunResult],
               best_secs: float | None) -> list[RunResult]:
        """``runs`` with the candidates that would become the best but compute wrong results
        turned into failed results. Candidates are checked fastest first until one passes
        (slower ones cannot be the best then); ``best_secs`` is the best so far (None: none)."""
        out = list(runs)
        order = sorted((i for i, r in enumerate(runs) if r.ok and artifacts[i]
                        and (best_secs is None or r.mean_secs < best_secs)),
                       key=lambda i: runs[i].mean_secs)
        for i in order:
            error = self.check(key, mod, target, args_info, artifacts[i])  # type: ignore[arg-type]
            if error is None:
                break
            logger.warning("%s: candidate %d is recorded as failed: %s", key, i, error)
            out[i] = RunResult(None, error, runs[i].device)
        return out
