"""The CPU ("llvm") design space: which rules and postprocessors, in which order."""

from __future__ import annotations

import tvm

from ..generator import SpaceGenerator, register_space
from ..inline import AutoInline
from .multi_level_tiling import LimitRegisterTile, MultiLevelTiling
from ..parallel_vectorize_unroll import ParallelVectorizeUnroll, RewriteParallelVectorizeUnroll
from ..params import TargetParams
from .layout_rewrite import RewriteLayout
from .operand_packing import PackOperands
from ..postproc import RewriteReductionBlock
from .attention import FusedAttention
from .int8_dot import Int8DotProduct
from .amx_intrin import has_amx
from .int8_intrin import int8_dot_intrinsic
from ..compute_location import PadInsideTiles, RandomComputeLocation
from .rfactor import AddRFactor
from .group_axis import SplitGroupAxis
from ..rule import FunctionRule, Postproc, ScheduleRule


def cpu_rules(params: TargetParams) -> list[ScheduleRule]:
    """The CPU schedule rules, in application order: a grouped convolution's group axis made
    an iter of its own, inline elementwise producers, rfactor
    reductions with too little spatial work, tile reductions with data reuse (with a write
    cache or fused epilogue), parallel/vectorise/unroll, then a sampled compute location
    for the blocks nothing else placed."""
    return [
        SplitGroupAxis(),
        AutoInline(into_consumer=True, into_producer=False),
        AddRFactor(params),
        MultiLevelTiling(params, structure="SSRSRS", write_levels=(1, 2)),
        ParallelVectorizeUnroll(params),
        RandomComputeLocation(),
    ]


def cpu_function_rules(params: TargetParams,
                       target: tvm.target.Target | None = None) -> list[FunctionRule]:
    """Whole-function schedules tried before the block rules: the fused attention, and the
    int8 convolutions and matmuls on the target's dot-product instruction when it has one
    (``int8_intrin.int8_dot_intrinsic``), and on AMX tiles where it has them
    (``amx_intrin.has_amx``)."""
    return [FusedAttention(params), Int8DotProduct(params, int8_dot_intrinsic(target),
                                                   amx=has_amx(target))]


def cpu_postprocs(params: TargetParams) -> list[Postproc]:
    """The CPU postprocessors, in order: a tiled block's padding left at the root is
    rejected (``PadInsideTiles``), then loop kinds and unroll pragmas, then the
    reduction inits are decomposed out of the reduction loops, then register tiles that
    cannot fit the target's SIMD registers are rejected, and last the layout-free weights
    (``layout_free_buffers``) are packed in the order the final loop nest reads them (once,
    at compile time), then the inputs a sketch chose to pack (in every call)."""
    return [PadInsideTiles(), RewriteParallelVectorizeUnroll(params), RewriteReductionBlock(),
            LimitRegisterTile(params), RewriteLayout(), PackOperands(params)]


def cpu_space(target: tvm.target.Target, params: TargetParams) -> SpaceGenerator:
    """The design space for an ``llvm`` target."""
    return SpaceGenerator(target, cpu_rules(params), cpu_postprocs(params), params,
                          cpu_function_rules(params, target))


register_space("llvm", cpu_space)
