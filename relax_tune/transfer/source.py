"""Where transferred schedules come from: the best records of alike workloads.

A ``TransferSource`` indexes the workloads of some databases (the session's own, the
library shipped with the package: ``library.py``) by structure (``similarity.py``) and
answers, for a new workload, the best schedules of the closest alike ones, refitted to its
shapes (``refit.py``); where fewer than ``per_task`` are alike, those alike up to the last
reduction block follow (another epilogue, every block of the new workload among theirs),
their other blocks' instructions dropped. A record tuned for a machine of another class
(another target kind, vector width or vector register count: ``space.params.target_params``)
is a schedule for other registers and lanes; ``same_class_only`` leaves those out.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import tvm
from tvm.s_tir import Trace

from ..database import Database
from ..database.records import is_baseline
from ..space.params import target_params
from ..utils import schedule_from_json, structural_hash
from .refit import refit_trace, register_fallbacks
from .similarity import (Shape, anchor_distance, epilogue_renames, shape_distance,
                         workload_shape)

logger = logging.getLogger(__name__)


@dataclass
class Transferred:
    """A schedule carried over from an alike workload: its trace on the new workload
    (sketch part, decisions fitted), how far the source's shapes were (``distance``), the
    least share of a tiling's inner tiles the fitting kept (``kept``, ``refit.Refitted``)
    and whether it was tuned on a machine of this one's class. ``fallbacks``: the same cache
    tiles with other register tiles (``refit.register_fallbacks``), to try in order when
    this one's register tiles do not fit the target."""

    trace: Trace
    distance: float
    same_class: bool
    kept: float = 1.0
    fallbacks: tuple = ()


def machine_class(target: tvm.target.Target | str | dict) -> tuple:
    """What makes a schedule's register and vector tiles fit a machine: the target kind,
    the SIMD width and the SIMD register count."""
    if not isinstance(target, tvm.target.Target):
        target = tvm.target.Target(target)
    params = target_params(target)
    return params.kind, params.vector_bytes, params.vector_registers


@dataclass
class _Entry:
    shape: Shape
    database: Database
    workload: object
    program: int


class TransferSource:
    """The best schedules of alike workloads in ``databases`` (see the module docstring).

    Args:
        databases: where to look, in order of preference at equal distance.
        own: the session's database, among ``databases``: its records of a workload are
            that task's own (its search starts from them), not a source for it.
        per_task: alike workloads consulted per new workload (closest first).
    """

    def __init__(self, databases: list[Database], own: Database | None = None,
                 per_task: int = 3) -> None:
        self.databases = [db for db in databases if db is not None]
        self.own = own
        self.per_task = per_task
        self._entries: list[_Entry] | None = None
        self._sources: dict[tuple[int, tuple | None], tuple] = {}
        self._classes: dict[str, tuple | None] = {}

    def _index(self) -> list[_Entry]:
        if self._entries is None:
            self._entries = []
            for db in self.databases:
                for wl in db.get_all_workloads():
                    try:
                        shape = workload_shape(wl.mod)
                    except Exception:  # noqa: BLE001 - a workload we cannot read is skipped
                        continue
                    if shape.extents is not None:
                        self._entries.append(
                            _Entry(shape, db, wl, wl.shash))
        return self._entries

    def _class_of(self, target: object) -> tuple | None:
        key = str(target)
        if key not in self._classes:
            try:
                self._classes[key] = machine_class(target)
            except Exception:  # noqa: BLE001 - a record's target we cannot parse
                self._classes[key] = None
        return self._classes[key]

    def _source(self, index: int, here: tuple, same_class_only: bool, target: str) -> tuple:
        """(schedule of the entry's best record on its own workload, same class) for the
        best record tuned for this very target (``str(target)``: the CPU LLVM names and its
        features), else of this machine's class, else (unless ``same_class_only``) of any;
        (None, False) when there is none."""
        key = (index, here if same_class_only else None, target)
        if key not in self._sources:
            self._sources[key] = self._find_source(self._index()[index], here, same_class_only,
                                                   target)
        return self._sources[key]

    def _find_source(self, entry: _Entry, here: tuple, same_class_only: bool,
                     target: str) -> tuple:
        records = [r for r in entry.database.get_top_k(entry.workload, 8)
                   if r.is_valid and not is_baseline(r.trace_json)]
        # the library holds a class's records from several CPUs (an AVX2 Zen 3, an AVX2
        # Zen 4 with AVX-512 hidden): the one tuned for this target first
        records.sort(key=lambda r: str(r.target) != target)
        ranked = [(r, True) for r in records if self._class_of(r.target) == here]
        if not same_class_only:
            ranked += [(r, False) for r in records if self._class_of(r.target) != here]
        for rec, same in ranked:
            try:
                return schedule_from_json(entry.workload.mod, rec.trace_json), same
            except Exception as err:  # noqa: BLE001 - a record of another space version
                logger.debug("transfer: source record does not replay: %s", err)
        return None, False

    def find(self, mod: tvm.IRModule, target: tvm.target.Target,
             same_class_only: bool = False) -> list[Transferred]:
        """The best schedules of the alike workloads closest to ``mod``, refitted to it,
        closest first; the workload itself (the same program) is not its own source."""
        try:
            shape = workload_shape(mod)
        except Exception:  # noqa: BLE001 - nothing to match
            return []
        program = structural_hash(mod)
        here = self._class_of(target)
        others = [(i, e) for i, e in enumerate(self._index())
                  if not (e.database is self.own and e.program == program)]
        alike = sorted((shape_distance(shape, e.shape), i, None) for i, e in others
                       if e.shape.key == shape.key)
        # alike up to the anchor, the blocks after it renamed to this workload's and those
        # it lacks dropped; not where this one has an epilogue block the source lacks (it
        # would run as its own loop nest: EfficientNet's SiLU after MobileNetV2's clip)
        anchored = sorted(((anchor_distance(shape, e.shape), i, renames) for i, e in others
                           if e.shape.key != shape.key
                           and (renames := epilogue_renames(shape, e.shape)) is not None),
                          key=lambda c: c[:2])
        out: list[Transferred] = []
        # the same blocks first: closer anchored sources were as often slower as faster
        # (MobileNetV2's convolutions with a residual add, docs/design/transfer.md)
        for distance, i, renames in alike + anchored:
            if len(out) >= self.per_task:
                break
            if not math.isfinite(distance):
                continue
            source, same = self._source(i, here, same_class_only, str(target))
            if source is None:
                continue
            refitted, why = refit_trace(source, mod, renames, self._index()[i].workload.mod)
            if refitted is None:
                logger.debug("transfer: %s", why)
                continue
            out.append(Transferred(refitted.trace, distance, same, refitted.kept,
                                   tuple(register_fallbacks(refitted))))
        return out
