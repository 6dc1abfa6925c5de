"""Dynamic shapes: tune a function with a symbolic dimension at hinted sizes, run it at all.

A TIR function whose shapes hold a symbolic variable (a sequence length ``n``) is tuned as
one static task per hinted size (a bucket), and applied as one function that dispatches on
``n`` to each bucket's schedule replayed on the symbolic function. The rest of relax_tune
calls in here; nothing outside this package knows how.

- ``hints``: the sizes a variable is tuned at (``shape_hints``, ``--dynamic``, defaults).
- ``buckets``: a function's symbolic variables, its buckets, the function at one size.
- ``workloads``: the tasks of a symbolic function, as extraction and apply see them.
- ``replay``: a static record's trace replayed on the symbolic function (a bucket branch).
- ``tiles``: full tiles run without their predicates (the predicated-tile rewrites).
- ``dispatch``: the dispatching function, and one bucket's branch built for measuring.
- ``apply``: ``ApplyDatabase``'s dynamic part: a symbolic function replaced by its dispatch.
- ``rank``: each bucket's records ranked as dispatched, after the search (opt-in).
- ``plan``: which bucket serves which sizes, measured after the search.
- ``tuning``: the tuning session's hooks (screen candidates; rank and plan after the search).
"""

from .buckets import Bucket, buckets_for, specialize, symbolic_vars
from .dispatch import dispatch_function, dispatch_module, dispatch_workload, upper_limit
from .hints import DEFAULT_MAX_SIZE, ShapeHints, default_sizes, normalize_hints, parse_shape_hints
from .replay import parallel_variable_factors, replay_symbolic, symbolic_trace_json, vector_tile
from .tiles import unswitch_partial_tiles
from .workloads import dynamic_base, dynamic_workloads, upper_bounds

from .tiles import _predicated_blocks  # noqa: F401 (the tests reach it here)

__all__ = [
    "Bucket", "DEFAULT_MAX_SIZE", "ShapeHints", "buckets_for", "default_sizes",
    "dispatch_function", "dispatch_module", "dispatch_workload", "dynamic_base",
    "dynamic_workloads", "normalize_hints", "parallel_variable_factors", "parse_shape_hints",
    "replay_symbolic", "specialize", "symbolic_trace_json", "symbolic_vars",
    "unswitch_partial_tiles", "upper_bounds", "upper_limit", "vector_tile",
]
