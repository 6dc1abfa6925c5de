"""Measurement: build candidates into shared libraries and time them on a device.

- ``LocalBuilder``: replays plain-JSON traces on a workload and compiles + exports each
  candidate in persistent worker processes (crash- and timeout-isolated); for a target of
  another instruction set it cross-links or exports a ``.tar`` the device links (``cross``).
- ``LocalRunner``: times exported libraries with the runtime's time evaluator, one candidate
  at a time, in a persistent worker process (crash- and timeout-isolated).
- ``RPCRunner``: the same on remote devices through TVM's RPC tracker, one session per
  candidate, spread over every server under a key; lost sessions are retried elsewhere.
- ``baseline``: what a task's baseline is on a target (the function as it is; on a GPU
  the target's default schedule, dlight).
- ``Measurer``: the measurement protocol of a tuning session (build, time, baseline,
  correctness screen, head-to-head, what a record stores), in ``measure/measurer.py``.

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
from .measurer import Measured, Measurer
from .rpc_runner import RPCRunner, parse_rpc_spec

__all__ = [
    "ERROR_CRASHED", "ERROR_TIMEOUT", "BuildResult", "Builder", "LocalBuilder", "LocalRunner",
    "MeasureError", "Measured", "Measurer", "RPCRunner", "RunResult", "Runner", "parse_rpc_spec",
]
