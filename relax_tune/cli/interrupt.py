"""Ctrl-C at the command line: the first press stops the command cleanly (records already
written are kept: each is appended, flushed and fsync'ed as it is measured); a further press
while the command is shutting its workers down ends the process at once with one line, not
with the tracebacks of the interrupted shutdown."""

from __future__ import annotations

import os
import signal
import sys

EXIT_INTERRUPTED = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""


def _exit_now(_signum, _frame) -> None:
    try:
        sys.stderr.write("relax-tune: stopped at once (Ctrl-C again); records already "
                         "written are kept\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def stop_on_next_interrupt() -> None:
    """From now on, Ctrl-C (SIGINT) ends the process at once with exit status 130 and one
    line on stderr. Call it when the first Ctrl-C has been caught and the command is
    cleaning up. Only the main thread may set signal handlers; elsewhere nothing changes."""
    try:
        signal.signal(signal.SIGINT, _exit_now)
    except ValueError:  # not the main thread (main() called from a thread)
        pass
