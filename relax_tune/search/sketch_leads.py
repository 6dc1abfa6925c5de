"""The candidates that lead a task's first batch whatever the cost model says: one of each
sketch that tensorizes (an int8 kernel on VNNI, on AMX tiles, ...). The model sees a
tensor instruction as an opaque call, so it cannot weigh one such sketch against another
before it has seen them timed; each is measured once."""

from __future__ import annotations

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
