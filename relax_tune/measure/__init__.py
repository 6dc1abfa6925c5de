"""Measurement: build candidates into shared libraries and time them on a device.

- ``LocalBuilder``: replays plain-JSON traces on a workload and compiles + exports each
  candidate in persistent worker processes (crash- and timeout-isolated).
- ``LocalRunner``: times exported libraries with the runtime's time evaluator, one candidate
  at a time, in a persistent worker process (crash- and timeout-isolated).

Every candidate gets a result; a failure is a result with ``error`` set (a database record
stores ``run_secs=[1e10]`` for it, see ``RunResult.secs_for_record``), never an exception.
"""

from .base import (
    ERROR_CRASHED,
    ERROR_TIMEOUT,
    Builder,
    BuildResult,
    MeasureError,
    Runner,
    RunResult,
)
from .local_builder import LocalBuilder
from .local_runner import LocalRunner

__all__ = [
    "ERROR_CRASHED", "ERROR_TIMEOUT", "BuildResult", "Builder", "LocalBuilder", "LocalRunner",
    "MeasureError", "RunResult", "Runner",
]
