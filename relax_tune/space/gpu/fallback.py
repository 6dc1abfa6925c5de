"""Rule-based schedules for GPU functions that have no tuning record."""

from __future__ import annotations

import tvm


def default_schedule_pass() -> tvm.transform.Pass:
    """``tvm.s_tir.dlight``'s default GPU schedules (Matmul, GEMV, Reduction,
    GeneralReduction, Fallback) as a pass. Put it after ``ApplyDatabase`` inside the
    target's scope: functions the database scheduled carry ``tirx.is_scheduled`` and are
    left alone, every other function gets the first matching rule -- tuned where tuned,
    rule-based elsewhere, and every kernel bound to GPU threads."""
    from tvm.s_tir import dlight as dl  # only GPU pipelines need it

    return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                   dl.gpu.GeneralReduction(), dl.gpu.Fallback())
