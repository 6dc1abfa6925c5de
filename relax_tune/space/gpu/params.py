"""GPU limits read from a CUDA target (never hard-coded per model of GPU), and a helper that
builds a complete CUDA target for an architecture."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import tvm

from ...utils import RelaxTuneError

logger = logging.getLogger("relax_tune.space.gpu")

GPU_KINDS = ("cuda",)
"""Target kinds the GPU design space is registered for."""

ANN_COOPERATIVE_FETCH = "relax_tune.cooperative_fetch"
"""Loop annotation on a shared-memory copy: the vector length of each thread's loads (int,
sampled); :class:`RewriteCooperativeFetch` splits the loop over the block's threads."""


@dataclass(frozen=True)
class GPUParams:
    """What the GPU rules and checks need to know about a target.

    Attributes:
        max_threads_per_block: threads one thread block may have.
        max_shared_memory_per_block: bytes of shared memory one thread block may use.
        registers_per_block: 32-bit registers of one thread block.
        warp_size: threads of a warp.
        max_registers_per_thread: registers one thread may use (255 on NVIDIA GPUs).
        max_vthread: largest virtual-thread extent.
        max_vector_bytes: widest vectorised load or store, in bytes.
        max_innermost_factor: largest innermost tile of a tiled loop (structures other
            than "SSSRRSRS").
        register_tile: cap of each of the two per-thread (register) tile levels of an axis.
        reduction_tile: cap of each of the two inner reduction tile levels.
        unroll_max_steps: candidates for ``pragma_auto_unroll_max_step``.
        vector_load_lens: candidate vector lengths of cooperative fetches.
        reduction_threads: candidate thread counts of a cross-thread reduction.
        bind_threads: candidate thread counts for blocks bound by :class:`AutoBind`.
    """

    max_threads_per_block: int = 1024
    max_shared_memory_per_block: int = 49152
    registers_per_block: int = 65536
    warp_size: int = 32
    max_registers_per_thread: int = 255
    max_vthread: int = 8
    max_vector_bytes: int = 16
    max_innermost_factor: int = 64
    register_tile: int = 4
    reduction_tile: int = 8
    unroll_max_steps: tuple[int, ...] = (0, 16, 64, 512, 1024)
    vector_load_lens: tuple[int, ...] = (1, 2, 4)
    reduction_threads: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256, 512)
    bind_threads: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)

    def constraints(self) -> dict[str, int]:
        """The limits as ``tvm.s_tir.analysis.verify_gpu_code`` constraints."""
        return {
            "max_shared_memory_per_block": self.max_shared_memory_per_block,
            "max_threads_per_block": self.max_threads_per_block,
            "max_thread_x": self.max_threads_per_block,
            "max_thread_y": self.max_threads_per_block,
            "max_thread_z": 64,
            "max_vthread": self.max_vthread,
            "max_vector_bytes": self.max_vector_bytes,
        }


def _int_attr(target: tvm.target.Target, *keys: str) -> int | None:
    attrs = target.attrs
    for key in keys:
        if key in attrs:
            try:
                return int(attrs[key])
            except (TypeError, ValueError):
                continue
    return None


def gpu_params(target: tvm.target.Target) -> GPUParams:
    """The limits of ``target`` (``max_threads_per_block`` or ``max_num_threads``,
    ``max_shared_memory_per_block``, ``registers_per_block``, ``thread_warp_size``); a limit
    the target does not name keeps the value every CUDA GPU since sm_50 has."""
    base = GPUParams()
    threads = _int_attr(target, "max_threads_per_block", "max_num_threads")
    shared = _int_attr(target, "max_shared_memory_per_block")
    regs = _int_attr(target, "registers_per_block")
    warp = _int_attr(target, "thread_warp_size")
    params = GPUParams(
        max_threads_per_block=threads or base.max_threads_per_block,
        max_shared_memory_per_block=shared or base.max_shared_memory_per_block,
        registers_per_block=regs or base.registers_per_block,
        warp_size=warp or base.warp_size,
    )
    logger.debug("GPU params for %s: %s", target, params)
    return params


def cuda_target(arch: str = "sm_80", host: tvm.target.Target | str | dict | None = None
                ) -> tvm.target.Target:
    """A CUDA target for compute capability ``arch`` ("sm_80", "sm_90"...) with the limits
    the design space checks (threads, shared memory and registers per block, warp size).
    The host defaults to :func:`relax_tune.utils.host_target` (this machine's CPU)."""
    if not isinstance(arch, str) or not arch.startswith("sm_") or not arch[3:5].isdigit():
        raise RelaxTuneError(f"CUDA arch {arch!r} is not a compute capability; use e.g. "
                             "'sm_80' (A100) or 'sm_90' (H100)")
    if host is None:
        from ...utils import host_target

        host = host_target()
    return tvm.target.Target({
        "kind": "cuda", "arch": arch, "max_threads_per_block": 1024, "max_num_threads": 1024,
        "max_shared_memory_per_block": 49152, "registers_per_block": 65536,
        "thread_warp_size": 32}, host=host)
