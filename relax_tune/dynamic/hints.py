"""Shape hints: the sizes a symbolic dimension is tuned at, and their weights.

``shape_hints`` (``TuneConfig``, ``extract_tasks``, ``ApplyDatabase``) and the command
line's ``--dynamic`` come in several forms; ``normalize_hints`` makes them one,
``{var name: {size: weight}}``. A variable no hint names is tuned at ``default_sizes``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ..utils import RelaxTuneError

DEFAULT_MAX_SIZE = 1024
"""Largest default hinted size of a symbolic dimension without an upper-bound annotation."""

ShapeHints = Mapping[str, Mapping[int, float]]
"""``{var name: {size: weight}}``: the sizes a symbolic variable is tuned at."""



def default_sizes(upper_bound: int | None = None) -> list[int]:
    """The sizes tuned when no hint names a variable: 1 and the powers of 4 up to the
    variable's upper bound (``tir_var_upper_bound`` of the Relax function), or up to
    ``DEFAULT_MAX_SIZE``; the bound itself when it is no power of 4."""
    bound = int(upper_bound) if upper_bound else DEFAULT_MAX_SIZE
    sizes = [1]
    while sizes[-1] * 4 <= bound:
        sizes.append(sizes[-1] * 4)
    if sizes[-1] != bound:
        sizes.append(bound)
    return sizes


def normalize_hints(hints) -> dict[str, dict[int, float]] | None:
    """``shape_hints`` in its one form ``{name: {size: weight}}``, or None.

    Accepted: ``{"n": [1, 16, 64]}`` (even weights), ``{"n": {16: 2.0, 64: 1.0}}`` (what
    matters more weighs more), or the command line's text ``"n=1,16,64;m=8"``. Anything
    else raises ``RelaxTuneError`` naming the bad part."""
    if hints is None:
        return None
    if isinstance(hints, str):
        return parse_shape_hints(hints)
    if not isinstance(hints, Mapping):
        raise RelaxTuneError(f"shape_hints must be a dict {{var name: [sizes]}}, e.g. "
                             f"{{'n': [1, 16, 64]}}, not {hints!r}")
    out: dict[str, dict[int, float]] = {}
    for name, sizes in hints.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise RelaxTuneError(f"shape_hints: {name!r} is not a symbolic variable name "
                                 "(e.g. 'n')")
        if isinstance(sizes, Mapping):
            pairs = list(sizes.items())
        elif isinstance(sizes, (list, tuple, set, frozenset, range)):
            pairs = [(s, 1.0) for s in sorted(sizes) if _is_int(s)] + \
                [(s, 1.0) for s in sizes if not _is_int(s)]
        else:
            raise RelaxTuneError(f"shape_hints[{name!r}] must be a list of sizes or a dict "
                                 f"{{size: weight}}, not {sizes!r}")
        if not pairs:
            raise RelaxTuneError(f"shape_hints[{name!r}] is empty: give at least one size")
        table: dict[int, float] = {}
        for size, weight in pairs:
            if not _is_int(size) or size < 1:
                raise RelaxTuneError(f"shape_hints[{name!r}]: size {size!r} is not a "
                                     "positive integer")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or \
                    not weight > 0:
                raise RelaxTuneError(f"shape_hints[{name!r}]: weight {weight!r} of size "
                                     f"{size} is not a positive number")
            table[int(size)] = float(weight)
        out[name] = dict(sorted(table.items()))
    return out


def parse_shape_hints(text: str | Sequence[str]) -> dict[str, dict[int, float]]:
    """Parse the command line's ``--dynamic`` values: ``"n=1,16,64"`` (several variables
    separated by ``;`` or given as several strings); a size may carry a weight,
    ``"n=16:2,64"``. A malformed part raises ``RelaxTuneError`` naming it."""
    parts = [text] if isinstance(text, str) else list(text)
    out: dict[str, dict[int, float]] = {}
    for part in (p.strip() for chunk in parts for p in chunk.split(";")):
        if not part:
            continue
        name, eq, sizes = part.partition("=")
        name = name.strip()
        if not eq or not name.isidentifier():
            raise RelaxTuneError(f"--dynamic {part!r}: write NAME=SIZE,SIZE,... "
                                 "(e.g. n=1,16,64,256)")
        if name in out:
            raise RelaxTuneError(f"--dynamic: {name!r} is given twice")
        table: dict[int, float] = {}
        for item in sizes.split(","):
            size, _, weight = item.strip().partition(":")
            if not re.fullmatch(r"[0-9]+", size) or int(size) < 1:
                raise RelaxTuneError(f"--dynamic {part!r}: {item.strip()!r} is not a positive "
                                     "integer size (SIZE or SIZE:WEIGHT)")
            try:
                w = float(weight) if weight else 1.0
            except ValueError:
                w = -1.0
            if not w > 0:
                raise RelaxTuneError(f"--dynamic {part!r}: weight {weight!r} of size {size} "
                                     "is not a positive number")
            table[int(size)] = w
        out[name] = dict(sorted(table.items()))
    if not out:
        raise RelaxTuneError("--dynamic: no sizes given; write e.g. n=1,16,64,256")
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
