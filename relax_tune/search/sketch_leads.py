"""The candidates that lead a task's first batch whatever the cost model says: the schedule
``best_predicted`` chose, then one of each sketch that tensorizes (an int8 kernel on VNNI,
on AMX tiles, ...); and the transferred schedules (``replay_transferred``), which lead it
too and are ``best_predicted``'s first answer.

The predicted schedule is applied only while nothing of the task is measured, so once
measured it must be among the measured. Scores change as the model learns other tasks'
batches, and a batch of 4 once left it out: an ONNX MobileNetV2 ran 18.9 ms after 60 s of
tuning, 9.8 ms predicted (AMD EPYC, docs/design/time-budget.md). The model sees a tensor
instruction as an opaque call, so it cannot weigh one tensorizing sketch against another
before it has seen them timed; each is measured once."""

from __future__ import annotations

from typing import Callable

from tvm.s_tir.schedule import Trace


def tensorized_leads(ranked: list, sketches: list[Trace]) -> list:
    """The best-ranked of ``ranked`` (pool entries, best first, each with a ``sketch``
    index into ``sketches``) of each sketch with a ``Tensorize`` instruction."""
    leads: dict[int, object] = {}
    for entry in ranked:
        if entry.sketch not in leads and any(
                i.kind.name == "Tensorize" for i in sketches[entry.sketch].insts):
            leads[entry.sketch] = entry
    return list(leads.values())


def first_batch_order(ranked: list, sketches: list[Trace], n: int,
                      predicted_key: str | None = None) -> list:
    """``ranked`` (pool entries, best first) reordered for a first batch of ``n``: the entry
    of ``predicted_key`` (the schedule ``best_predicted`` chose) first, then
    ``tensorized_leads``, then the rest."""
    lead = [e for e in ranked if predicted_key is not None and e.cand.key == predicted_key]
    first = lead + [e for e in tensorized_leads(ranked, sketches)[:n]
                    if all(e is not f for f in lead)]
    return first + [e for e in ranked if all(e is not f for f in first)]


def put_first(first: list, ranked: list) -> list:
    """``ranked`` (pool entries) with the entries of ``first`` moved to its front."""
    taken = {e.cand.key for e in first}
    return first + [e for e in ranked if e.cand.key not in taken]


def replay_transferred(found: list, job: Callable, replay: Callable) -> list[tuple]:
    """``(job, outcome)`` of each transferred schedule (``transfer.Transferred``), replayed
    together by ``replay`` (jobs made by ``job(trace)``). Where the postprocessing rejects
    one, its ``fallbacks`` (other register tiles of the same cache tiles) are tried in
    order: the fitting can grow a register tile past the target's registers (a 1x1
    convolution's 5 rows of two vectors at 10x10 became 7 rows at 14x14), which left
    MobileNetV2's heaviest tasks to the model's choice, up to 3x slower (AMD EPYC Zen 3)."""
    jobs = [job(item.trace) for item in found]
    outs = list(replay(jobs)) if jobs else []
    for k in range(max((len(item.fallbacks) for item in found), default=0)):
        retry = [i for i, out in enumerate(outs)
                 if not out.ok and len(found[i].fallbacks) > k]
        again = [job(found[i].fallbacks[k]) for i in retry]
        for i, job_, out in zip(retry, again, replay(again) if again else []):
            jobs[i], outs[i] = job_, out
    return list(zip(jobs, outs))


MAX_APPLY_DISTANCE = 4.5
"""A transferred schedule from a workload this close (``transfer.similarity.shape_distance``)
and a machine of this one's class is the no-measurement choice over the model's. Measured
against the model's choice on ResNet-18's and MobileNetV2's tasks (each task's schedule
transferred from its closest other alike task): up to 4.5 the transferred one was as fast
(within 5%) or faster on 21 of 26 tasks; past it slower on 8 of 13, up to 5x
(docs/design/transfer.md)."""
MIN_APPLY_KEPT = 0.5
"""... and only when the refitted inner tiles are at least half (and at most twice) the
size of the source's in every tiling (``transfer.refit.Refitted.kept``): a source whose
tiles the new extents cannot come near gives another, untuned schedule. With the library's
160x160 models on ResNet-18 and MobileNetV2 at 224x224 (5x5 maps against 7x7), the schedules
that pass ran their kernels 11% faster than the model's choices in sum, weighted by calls
(39.8 against 44.9 ms; 9.1 against 10.2 ms: docs/design/transfer.md)."""


def applies_unmeasured(item) -> bool:
    """Whether a transferred schedule (``transfer.Transferred``) is applied without
    measurement, ahead of the model's choice: tuned on a machine of this one's class, from a
    workload within ``MAX_APPLY_DISTANCE``, its tiles refitted within ``MIN_APPLY_KEPT``."""
    return bool(item.same_class and item.distance <= MAX_APPLY_DISTANCE
                and item.kept >= MIN_APPLY_KEPT)
