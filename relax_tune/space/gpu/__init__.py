"""The GPU (CUDA) design space: multi-level tiling bound to blockIdx / vthread / threadIdx
with shared-memory staging and local accumulation, cross-thread reductions, auto-binding,
sampled unrolling, and a check of every candidate against the target's limits
(``tvm.s_tir.analysis.verify_gpu_code``) before it is built. Importing this package
registers the space for ``cuda`` targets and, where NVRTC's Python bindings are missing,
makes TVM compile CUDA modules with nvcc (:func:`ensure_cuda_compiler`)."""

from .bind import AutoBind, RewriteUnboundBlock
from .compile import compile_cuda, cuda_source, ensure_cuda_compiler, find_nvcc
from .fallback import default_schedule_pass
from .params import ANN_COOPERATIVE_FETCH, GPUParams, cuda_target, gpu_params
from .postprocs import (RewriteCooperativeFetch, RewriteReductionBlockGPU, VerifyGPUCode,
                        lower_for_verification)
from .reduction import CrossThreadReduction
from .space import GPUAutoInline, cuda_space, gpu_postprocs, gpu_rules
from .tiling import MultiLevelTilingGPU

__all__ = [
    "ANN_COOPERATIVE_FETCH", "AutoBind", "CrossThreadReduction", "GPUAutoInline",
    "GPUParams", "MultiLevelTilingGPU", "RewriteCooperativeFetch", "RewriteReductionBlockGPU",
    "RewriteUnboundBlock", "VerifyGPUCode", "compile_cuda", "cuda_source", "cuda_space",
    "cuda_target", "default_schedule_pass", "ensure_cuda_compiler", "find_nvcc", "gpu_params",
    "gpu_postprocs", "gpu_rules", "lower_for_verification",
]

