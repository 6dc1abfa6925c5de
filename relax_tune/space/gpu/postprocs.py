"""GPU postprocessors: cooperative fetches, reduction inits, and the target-limit check
that runs before anything is built."""

from __future__ import annotations

import logging
from typing import Any

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule import SBlockRV

from .. import analysis as A
from ..postproc import RewriteReductionBlock
from ..rule import Postproc
from .params import ANN_COOPERATIVE_FETCH, GPUParams

logger = logging.getLogger("relax_tune.space.gpu")


def _thread_extent(sch: Schedule, block: SBlockRV, tag: str = "threadIdx.x") -> int | None:
    for loop in sch.get_loops(block):
        stmt = sch.get(loop)
        binding = stmt.thread_binding
        if binding is not None and str(binding.thread_tag) == tag:
            return A.loop_extent(sch, loop)
    return None


class RewriteCooperativeFetch(Postproc):
    """Turn each copy loop annotated ``relax_tune.cooperative_fetch`` (by
    :class:`MultiLevelTilingGPU`) into a fetch shared by all threads of the block: split it
    into ``[rest, threadIdx.x extent, vector length]``, bind the middle part to threadIdx.x
    and vectorise the innermost."""

    name = "rewrite_cooperative_fetch"

    def apply(self, sch: Schedule) -> bool:
        """Rewrite every annotated copy loop; False when a block has no threadIdx.x."""
        for block in A.collect_blocks(sch):
            if A.is_root(sch, block):
                continue
            for loop in sch.get_loops(block):
                anns = sch.get(loop).annotations
                if ANN_COOPERATIVE_FETCH not in anns:
                    continue
                vec = int(anns[ANN_COOPERATIVE_FETCH])
                threads = _thread_extent(sch, block)
                if threads is None:
                    return False
                sch.unannotate(loop, ANN_COOPERATIVE_FETCH)
                if vec > 1:
                    _, tx, inner = sch.split(loop, [None, threads, vec])
                    sch.vectorize(inner)
                else:
                    _, tx = sch.split(loop, [None, threads])
                sch.bind(tx, "threadIdx.x")
                break
        return True


class RewriteReductionBlockGPU(RewriteReductionBlock):
    """:class:`RewriteReductionBlock` for GPUs: a reduction whose reduction loop is bound to
    a thread (a cross-thread reduction) keeps its init, which TVM's all-reduce lowering
    needs."""

    name = "rewrite_reduction_block_gpu"

    @staticmethod
    def _reduction_blocks(sch: Schedule) -> list[SBlockRV]:
        out = []
        for block in RewriteReductionBlock._reduction_blocks(sch):
            if any(A.loop_kind(sch, lp) == A.FOR_THREAD_BINDING
                   and A.loop_iter_type(sch, lp) != "S" for lp in sch.get_loops(block)):
                continue
            out.append(block)
        return out


def _lowering_passes() -> tvm.transform.Pass:
    """The lowering a scheduled function goes through before CUDA code generation, up to
    the point where thread extents, shared and local allocations are final."""
    return tvm.transform.Sequential([
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.StmtSimplify(),
        s_tir.transform.LowerAutoCopy(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.InjectSoftwarePipeline(),
        s_tir.transform.LowerOpaqueBlock(),
        tirx.transform.FlattenBuffer(),
        tirx.transform.NarrowDataType(32),
        tirx.transform.StmtSimplify(),
        tirx.transform.VectorizeLoop(True),
        s_tir.transform.InjectVirtualThread(),
        tirx.transform.StorageRewrite(),
    ])


def lower_for_verification(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` lowered to the point where its GPU resource use can be verified."""
    with target:
        return _lowering_passes()(mod)


class VerifyGPUCode(Postproc):
    """Reject a candidate that would not run on the target: too many threads per block,
    too much shared memory, too many virtual threads, vector accesses wider than 16 bytes
    (``tvm.s_tir.analysis.verify_gpu_code`` on the lowered function), or more registers of
    local arrays than the target allows (per thread, and per block for the block's
    threads). Runs before anything is built."""

    name = "verify_gpu_code"

    def __init__(self, params: GPUParams, target: tvm.target.Target) -> None:
        self.params = params
        self.target = target

    def apply(self, sch: Schedule) -> bool:
        """True when every function of the scheduled module fits the target."""
        reason = self.why_not(sch.mod)
        if reason is not None:
            logger.debug("rejected: %s", reason)
        return reason is None

    def why_not(self, mod: tvm.IRModule) -> str | None:
        """None when ``mod`` fits the target, else what it exceeds."""
        for gv, func in mod.functions.items():
            vthreads = _vthreads(func) if isinstance(func, tirx.PrimFunc) else 1
            if vthreads > self.params.max_vthread:
                return (f"{gv.name_hint} has {vthreads} virtual threads, past the limit of "
                        f"{self.params.max_vthread}")
        lowered = lower_for_verification(mod, self.target)
        for gv, func in lowered.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            threads = max(_thread_extents(func) or [1])
            regs = min(self.params.max_registers_per_thread,
                       self.params.registers_per_block // max(1, threads))
            limits = dict(self.params.constraints())
            limits["max_local_memory_per_block"] = 4 * regs
            if not s_tir.analysis.verify_gpu_code(func, limits):
                broken = [f"{key}={value}" for key, value in limits.items()
                          if not s_tir.analysis.verify_gpu_code(func, {key: value})]
                return (f"{gv.name_hint} exceeds the target's {', '.join(broken) or limits} "
                        f"(threads per block {threads})")
        return None


def _thread_extents(func: tirx.PrimFunc) -> list[int]:
    """Threads per block of each kernel launch in a lowered function: under each outermost
    ``thread_extent`` attribute (a launch), the product over threadIdx.x/y/z of the largest
    extent bound to it."""
    launches: list[int] = []
    for root in _launch_roots(func.body):
        per_tag: dict[str, int] = {}

        def on_attr(node: Any) -> None:
            if str(node.attr_key) != "thread_extent" or not isinstance(node.value, tirx.IntImm):
                return
            tag = str(node.node.thread_tag)
            if tag.startswith("threadIdx"):
                per_tag[tag] = max(per_tag.get(tag, 1), int(node.value.value))

        tvm_ffi.structural_walk(root, [(tirx.AttrStmt, on_attr)])
        launches.append(_prod(per_tag.values()))
    return launches


def _launch_roots(stmt: Any) -> list[Any]:
    """The outermost ``thread_extent`` attribute statements under ``stmt``."""
    if stmt is None:
        return []
    if isinstance(stmt, tirx.AttrStmt) and str(stmt.attr_key) == "thread_extent":
        return [stmt]
    if isinstance(stmt, tirx.SeqStmt):
        return [r for s in stmt.seq for r in _launch_roots(s)]
    out = []
    for attr in ("body", "then_case", "else_case"):
        child = getattr(stmt, attr, None)
        if isinstance(child, tirx.Stmt):
            out.extend(_launch_roots(child))
    return out


def _vthreads(func: tirx.PrimFunc) -> int:
    """The largest product of vthread extents around one block of a scheduled function
    (checked before lowering: InjectVirtualThread removes them)."""
    best = 1

    def visit(stmt: Any, product: int) -> None:
        nonlocal best
        if stmt is None:
            return
        if isinstance(stmt, tirx.For):
            binding = stmt.thread_binding
            if binding is not None and str(binding.thread_tag).startswith("vthread") \
                    and isinstance(stmt.extent, tirx.IntImm):
                product *= int(stmt.extent.value)
                best = max(best, product)
            visit(stmt.body, product)
            return
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, product)
            return
        if isinstance(stmt, tvm.s_tir.SBlockRealize):
            visit(stmt.block.body, product)
            return
        for attr in ("body", "then_case", "else_case"):
            child = getattr(stmt, attr, None)
            if isinstance(child, tirx.Stmt):
                visit(child, product)

    visit(func.body, 1)
    return best


def _prod(values: Any) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out
