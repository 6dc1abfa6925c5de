"""From a user's Relax module to the TIR functions that get tuned: parameters bound and
folded, graph rewrites (quantized convolutions and matmuls in integers, batch norms folded,
channels-last and Winograd convolutions, fused attention, vectorisable math, bounded
shapes), legalisation and fusion.

``lower_for_tuning`` is the entry point the pipeline and the model loader call; the
rewrites are ``relax.transform``-style module passes, each in a module of its own, built on
the helpers of ``rewrite``.
"""

from .prepare import (backend_pipeline, bind_and_fold, bind_params, default_prepack,
                      lower_for_tuning, lowering_passes)

__all__ = ["backend_pipeline", "bind_and_fold", "bind_params", "default_prepack",
           "lower_for_tuning", "lowering_passes"]
