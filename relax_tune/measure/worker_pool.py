"""The worker processes that build, time and replay candidates, started without PyTorch.

TVM's FFI imports ``torch`` whenever it is installed, so every ``python -m
tvm.exec.popen_worker`` of a machine with PyTorch (a user's who imports PyTorch models, the
test and benchmark extras) paid for it: 3.7-4.6 s and 534 MB per worker to start, against
1.1-1.6 s and 275 MB without it (Intel Xeon, torch 2.13). A tuning session starts three or
four workers on a 2-core machine, beside its own predictions. The workers never use PyTorch:
``WorkerPool`` starts them with ``_torchless`` first on their ``PYTHONPATH``, where ``torch``
is a package whose import fails, which TVM's FFI takes as "not installed". The user's own
process and its imports are left alone.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tvm.support.popen_pool import PopenPoolExecutor, PopenWorker

TORCHLESS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torchless")
"""Holds the ``torch`` package that fails to import, first on the workers' path."""

_ENV_LOCK = threading.Lock()


@contextmanager
def _torchless_path() -> Iterator[None]:
    """``TORCHLESS_DIR`` first on ``PYTHONPATH`` while a worker process is started (the
    child takes the environment when it is created; ours is restored at once)."""
    with _ENV_LOCK:
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = TORCHLESS_DIR + (os.pathsep + old if old else "")
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = old


class _TorchlessWorker(PopenWorker):
    """A ``PopenWorker`` whose process starts without PyTorch."""

    def _start(self) -> None:
        if self._proc is not None:
            return
        with _torchless_path():
            super()._start()


class WorkerPool(PopenPoolExecutor):
    """TVM's ``PopenPoolExecutor`` (same arguments), its workers started without PyTorch."""

    def _worker_run(self, fn: Any, args: Any, kwargs: Any) -> Any:
        with self._lock:  # the pool's own worker creation, with our worker class
            tid = threading.get_ident()
            if tid not in self._worker_map:
                self._worker_map[tid] = _TorchlessWorker(
                    self._initializer, self._initargs, self._maximum_process_uses,
                    self._stdout, self._stderr)
        return super()._worker_run(fn, args, kwargs)
