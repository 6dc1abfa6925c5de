"""``ClippedTakes``: every ``take`` in "clip" mode, none in "fast".

TVM's frontends emit ``take`` (an embedding lookup, ``x[:, 0]``, ONNX's Gather) in its
default "fast" mode: an index out of bounds reads past the table, and TOPI logs "Fast mode
segfaults when there are out-of-bounds indices" each time it legalizes one (52 lines in
one no-measurement compile of the BERT-class encoder, 800 in a tuned ViT's). "clip" clamps
the index instead: a token id past the vocabulary reads the last row rather than another
process's memory, for two integer operations per index, and nothing is logged.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from .rewrite import rewrite_functions


def clipped(call: relax.Call) -> relax.Expr:
    """``call`` (a ``take``) in "clip" mode (itself when it is in another mode)."""
    if str(call.attrs.mode) != "fast":
        return call
    return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="clip")


@tvm.transform.module_pass(opt_level=0, name="relax_tune.ClippedTakes")
class ClippedTakes:
    """Rewrite every "fast" ``take`` of the module's Relax functions into a "clip" one (see
    the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        pattern = is_op("relax.take")(wildcard(), wildcard())
        return rewrite_functions(mod, pattern, lambda call, _matches: clipped(call))
