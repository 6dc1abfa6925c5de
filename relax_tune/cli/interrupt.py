"""Ctrl-C at the command line, pressed once or many times, ends in one line.

- The first press raises KeyboardInterrupt in the command, which stops cleanly: records
  already written are kept (each is appended, flushed and fsync'ed as it is measured).
- A further press, while the command shuts its workers down, ends the process at once with
  one line (exit status 130), instead of tracebacks of the interrupted shutdown.
- Once the command has returned, Python's own shutdown puts the default SIGINT action back
  (the interpreter's signal finalisation): a press landing then would kill the process by
  the signal (status -2, not 130). The exit therefore ignores SIGINT from its atexit step
  on: the finalisation leaves an ignored signal ignored. (Blocking it would not do: the
  mask is per thread, and TVM's pool threads would still take the signal.)
- A terminal sends SIGINT to every process of the foreground group, the build and run
  workers included: a worker hit while it imports TVM would print a traceback of its own.
  The command line's workers therefore start with SIGINT blocked (the spawning thread
  blocks it; a child inherits the mask); they are stopped by the command, never by Ctrl-C.
  This is done in the ``relax-tune`` process only: importing relax_tune changes nothing.
"""

from __future__ import annotations

import atexit
import functools
import os
import signal
import sys
from collections.abc import Callable

EXIT_INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""


def _exit_now(_signum, _frame) -> None:
    try:
        sys.stderr.write("\nrelax-tune: stopped at once (Ctrl-C again); records already "
                         "written are kept\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def _first_press(signum, frame) -> None:
    stop_on_next_interrupt()
    raise KeyboardInterrupt


def _ignore_presses_while_exiting() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_on_next_interrupt() -> None:
    """From now on, Ctrl-C (SIGINT) ends the process at once with exit status 130 and one
    line on stderr, and is ignored once the interpreter's exit has begun (atexit runs
    before it drops its signal handlers). Only the main thread may set signal handlers;
    elsewhere nothing changes."""
    try:
        signal.signal(signal.SIGINT, _exit_now)
    except ValueError:  # not the main thread (main() called from a thread)
        return
    # once, and last: atexit runs the last registered first
    atexit.unregister(_ignore_presses_while_exiting)
    atexit.register(_ignore_presses_while_exiting)


def handle_interrupts() -> Callable[[], None]:
    """Install the command line's Ctrl-C handling (the module docstring); return a function
    that puts the previous SIGINT handler back unless Ctrl-C was pressed (then the process
    is ending: a further press must still end it at once)."""
    _shield_workers()
    try:
        previous = signal.signal(signal.SIGINT, _first_press)
    except ValueError:  # not the main thread
        return lambda: None

    def restore() -> None:
        if signal.getsignal(signal.SIGINT) is _first_press:
            signal.signal(signal.SIGINT, previous)

    return restore


def _shield_workers() -> None:
    """Make TVM's ``PopenWorker`` (the build, run and replay workers) start with SIGINT
    blocked, once per process."""
    from tvm.support import popen_pool

    start = popen_pool.PopenWorker._start
    if getattr(start, "_relax_tune_shielded", False):
        return

    @functools.wraps(start)
    def shielded_start(self, *args, **kwargs):
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return start(self, *args, **kwargs)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    shielded_start._relax_tune_shielded = True  # type: ignore[attr-defined]
    popen_pool.PopenWorker._start = shielded_start
