"""Where a command may write: output files and folders checked before any work, so that a
bad ``-o`` is one clear line (never a traceback after minutes of compiling) and no output
ever replaces a work_dir's own files or a source the user gave.

Every check raises ``RelaxTuneError`` naming the path and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from .utils import RelaxTuneError


def same_path(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` name the same file (through links and ``..``), existing or
    not."""
    if os.path.exists(a) and os.path.exists(b):
        try:
            return os.path.samefile(a, b)
        except OSError:
            pass
    return os.path.realpath(a) == os.path.realpath(b)


def ensure_output_dir(path: str, what: str, hint: str) -> None:
    """Create folder ``path`` (``what`` names it in messages) when missing and check that it
    can be written; ``hint`` says what to do instead (e.g. "give -o DIR")."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise RelaxTuneError(f"{what} {path!r} is a file, not a folder: {hint}")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise RelaxTuneError(f"cannot create {what} {path!r} ({err.strerror or err}): "
                             f"{hint}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise RelaxTuneError(f"{what} {path!r} is read-only: {hint}")


def check_output_file(path: str, what: str, protected: Iterable[str] = (),
                      protected_why: str = "") -> None:
    """Refuse ``path`` as the output file ``what`` when it is an existing folder, one of the
    ``protected`` files (a work_dir's database, the model: ``protected_why`` says whose), or
    in a folder that cannot be made or written. Makes the output's folder when missing."""
    if not path or not path.strip():
        raise RelaxTuneError(f"{what}: no file name given")
    if os.path.isdir(path):
        raise RelaxTuneError(f"{what} {path!r} is an existing folder: give a file name, "
                             f"e.g. {os.path.join(path, 'out')}")
    for other in protected:
        if same_path(path, other):
            raise RelaxTuneError(f"{what} {path!r} is {protected_why or 'an input'} and would "
                                 "be overwritten: write to another file")
    parent = os.path.dirname(os.path.abspath(path))
    ensure_output_dir(parent, f"the folder of {what}",
                      "write to a folder you can create and write to")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise RelaxTuneError(f"{what} {path!r} exists and is read-only: write to another file")
