"""The CUDA design space: which rules and postprocessors, in which order."""

from __future__ import annotations

import dataclasses

import tvm
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .. import analysis as A
from ..generator import SpaceGenerator, register_space
from ..inline import AutoInline
from ..parallel_vectorize_unroll import ParallelVectorizeUnroll, RewriteParallelVectorizeUnroll
from ..params import TargetParams
from ..rule import Postproc, ScheduleRule
from .bind import AutoBind, RewriteUnboundBlock
from .params import GPU_KINDS, GPUParams, gpu_params
from .postprocs import RewriteCooperativeFetch, RewriteReductionBlockGPU, VerifyGPUCode
from .reduction import CrossThreadReduction
from .tiling import MultiLevelTilingGPU


class GPUAutoInline(AutoInline):
    """:class:`AutoInline` that also inlines padding (a spatial block with an if-then-else
    whose reads are an injective, ordered image of its write) into its consumer: on a GPU
    the branch costs less than a separate kernel and a round trip through global memory."""

    name = "gpu_auto_inline"

    def inline_options(self, sch: Schedule, block: SBlockRV) -> list[str]:
        """As :meth:`AutoInline.inline_options`, plus "consumer" for a pad block."""
        options = super().inline_options(sch, block)
        if options or not self.into_consumer:
            return options
        blk = sch.get(block)
        if (len(blk.writes) != 1 or not A.is_spatial(sch, block)
                or not A.has_if_then_else(sch, block) or not sch.get_consumers(block)):
            return options
        if self.disallow_ops and A.called_ops(sch, block) & set(self.disallow_ops):
            return options
        for read in blk.reads:
            exists, injective, _ordered = A.read_write_pattern(read, blk.writes[0])
            if not (exists and injective):
                return options
        return ["consumer"]


def _unroll_params(params: GPUParams) -> TargetParams:
    return dataclasses.replace(TargetParams(kind="cuda"),
                               unroll_max_steps=tuple(params.unroll_max_steps))


def gpu_rules(params: GPUParams) -> list[ScheduleRule]:
    """The GPU schedule rules, in application order: inline elementwise producers and
    consumers, offer cross-thread reductions, tile what is worth tiling ("SSSRRSRS"), bind
    the rest, then sample the unroll step."""
    return [
        GPUAutoInline(into_consumer=True, into_producer=True),
        CrossThreadReduction(params),
        MultiLevelTilingGPU(params),
        AutoBind(params),
        ParallelVectorizeUnroll(_unroll_params(params), parallel=False, vectorize=False,
                                unroll=True),
    ]


def gpu_postprocs(params: GPUParams, target: tvm.target.Target) -> list[Postproc]:
    """The GPU postprocessors, in order: cooperative fetches, binding of what is still
    unbound, unroll pragmas, reduction inits, then the check against the target's limits."""
    return [
        RewriteCooperativeFetch(),
        RewriteUnboundBlock(params),
        RewriteParallelVectorizeUnroll(_unroll_params(params)),
        RewriteReductionBlockGPU(),
        VerifyGPUCode(params, target),
    ]


def cuda_space(target: tvm.target.Target, params: TargetParams) -> SpaceGenerator:
    """The design space for a ``cuda`` target."""
    gparams = gpu_params(target)
    return SpaceGenerator(target, gpu_rules(gparams), gpu_postprocs(gparams, target), params)


for _kind in GPU_KINDS:
    register_space(_kind, cuda_space)
