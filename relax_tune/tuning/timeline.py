"""The session's timeline: after every measured batch, one JSON line in the work_dir's
``logs/timeline.jsonl`` -- seconds of tuning so far (resumed sessions continue the clock),
the task, its weight, its best and untuned times. ``report.model_curve`` turns it into the
model's estimated latency against tuning seconds."""

from __future__ import annotations

import json
import logging
import os
import time

logger = logging.getLogger(__name__)


class Timeline:
    """Appends the session's points to ``path`` (see the module doc); never raises: a
    timeline that cannot be written is logged once and dropped."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = last_seconds(path)
        self.start = time.monotonic()
        self._broken = False

    def point(self, report) -> None:
        """The state of ``report``'s task after a batch."""
        if self._broken:
            return
        line = {"t": round(self.offset + time.monotonic() - self.start, 3),
                "task": report.task_name, "shash": str(report.task.shash),
                "weight": report.weight, "best": report.best_secs,
                "baseline": report.baseline_secs}
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(json.dumps(line) + "\n")
        except OSError as err:
            self._broken = True
            logger.warning("the tuning timeline is not written (%s): %s", self.path, err)


def read_timeline(path: str) -> list[dict]:
    """The points of a timeline file (none when missing; unreadable lines skipped)."""
    points = []
    try:
        with open(path, encoding="utf-8") as file:
            for line in file:
                try:
                    point = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(point, dict) and isinstance(point.get("t"), (int, float)):
                    points.append(point)
    except OSError:
        pass
    return points


def last_seconds(path: str) -> float:
    """The tuning seconds a timeline reached (0 when there is none)."""
    points = read_timeline(path)
    return float(points[-1]["t"]) if points else 0.0


def _applied(point: dict) -> float | None:
    """What ApplyDatabase would run for the point's task: its best or its untuned time."""
    known = [x for x in (point.get("best"), point.get("baseline")) if x]
    return min(known) if known else None


def model_curve(points: list[dict]) -> list[tuple[float, float, int]]:
    """``(tuning seconds, estimated model latency in seconds, tasks in it)`` from a
    timeline: at 0 s and after every batch, the sum over the tasks measured by the end of
    weight x the time ApplyDatabase would run then. A task not yet measured at a point
    counts with its first measured time, the closest measured stand-in for the schedule it
    had then (its first batch holds the cost model's first choice, its predicted schedule),
    so the curve starts near the no-measurement compile and only shows what tuning bought.
    Tasks never measured are left out of every point."""
    first: dict[str, tuple[int, float]] = {}
    for point in points:
        applied = _applied(point)
        if applied is not None and point.get("shash") not in first:
            first[point["shash"]] = (int(point.get("weight") or 1), applied)
    if not first:
        return []
    current = dict(first)
    curve = [(0.0, sum(w * x for w, x in current.values()), len(current))]
    for point in points:
        applied = _applied(point)
        if applied is None or point.get("shash") not in current:
            continue
        current[point["shash"]] = (current[point["shash"]][0], applied)
        curve.append((float(point["t"]), sum(w * x for w, x in current.values()),
                      len(current)))
    return curve


def curve_at(curve: list[tuple[float, float, int]], secs: float) -> float | None:
    """The curve's estimate after ``secs`` of tuning (None past its end)."""
    if not curve or secs > curve[-1][0]:
        return None
    return [est for t, est, _ in curve if t <= secs][-1]
