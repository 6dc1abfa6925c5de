"""Layout rewrite of constant weights (Ansor's ``layout_free_placeholders``).

A PrimFunc whose ``layout_free_buffers`` attribute lists parameters (TVM's
``relax.transform.AttachAttrLayoutFreeBuffers`` sets it for model weights and constants) may
store those buffers in whatever layout its schedule reads fastest: the packing runs once,
at compile time, not per call. ``RewriteLayout`` gives every such weight the layout its
consuming block walks it in, tile by tile (``suggest_index_map`` over the final loop nest),
through a ``cache_read`` block annotated ``meta_schedule.layout_rewrite_preproc`` followed
by ``transform_layout`` of the cached buffer. Both are schedule instructions, so the trace
replays the rewrite wherever the record is applied. In a Relax module the annotated block is
then split into its own function (``relax.transform.SplitLayoutRewritePreproc``) and folded
(``FoldConstant`` over bound weights) or lifted (``LiftTransformParams``).

For measurement the builder splits the candidate in two (``split_layout_rewrite``): the
kernel reading the packed weight, and a packing function run once before timing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule
from tvm.s_tir.schedule.analysis import suggest_index_map

from .. import analysis as A
from ..rule import Postproc

logger = logging.getLogger(__name__)

#: The block annotation TVM's SplitLayoutRewritePreproc and RemoveWeightLayoutRewriteBlock
#: look for (a plain string: nothing of MetaSchedule's is imported).
PREPROC_ANNOTATION = "meta_schedule.layout_rewrite_preproc"


@dataclass
class _Read:
    block: str
    read_index: int
    indices: list
    loops: list
    predicate: Any


def layout_free_buffers(func: tirx.PrimFunc) -> list[tirx.Buffer]:
    """The buffers of ``func``'s parameters listed in its ``layout_free_buffers`` attribute."""
    if func.attrs is None or "layout_free_buffers" not in func.attrs:
        return []
    return [func.params[int(index)] for index in func.attrs["layout_free_buffers"]
            if 0 <= int(index) < len(func.params)]


def _reads_of(func: tirx.PrimFunc, buffer: tirx.Buffer) -> list[_Read]:
    """Every block that loads ``buffer`` directly, with the load's indices (block vars
    replaced by their bindings), the loops above it and the block's predicate."""
    found: list[_Read] = []
    loops: list[tirx.For] = []

    def visit(stmt: Any) -> None:
        if isinstance(stmt, tirx.For):
            loops.append(stmt)
            visit(stmt.body)
            loops.pop()
            return
        if isinstance(stmt, tvm.s_tir.SBlockRealize):
            block = stmt.block
            read_index = next((i for i, region in enumerate(block.reads)
                               if region.source.same_as(buffer)), None)
            if read_index is not None:
                loads: list = []
                tvm_ffi.structural_walk(block.body, [(
                    tvm.ir.TensorLoad,
                    lambda load: loads.append(load) if load.source.same_as(buffer) else None)])
                for load in loads:
                    # An index map from the block vars to the load's indices, applied to the
                    # block's bindings, is the load written in loop variables.
                    to_loop_vars = tirx.IndexMap([iv.var for iv in block.iter_vars],
                                                 list(load.indices), None)
                    indices = to_loop_vars.map_indices(list(stmt.iter_values))
                    found.append(_Read(str(block.name_hint), read_index, list(indices),
                                       list(loops), stmt.predicate))
            visit(block.body)
            return
        for child in A._children(stmt):
            visit(child)

    visit(func.body)
    return found


class RewriteLayout(Postproc):
    """Pack every layout-free weight into the order its consumer reads it (a no-op for
    functions without ``layout_free_buffers``). A weight read by several blocks or loads,
    or one TVM suggests no layout for, keeps its layout."""

    name = "rewrite_layout"

    def apply(self, sch: Schedule) -> bool:
        """Insert the packing block and transform the packed buffer's layout; True unless a
        primitive fails (the candidate is then dropped)."""
        func_name = A.func_name_of(sch)
        for buffer in layout_free_buffers(sch.mod[func_name]):
            packer = pack_buffer(sch, func_name, buffer)
            if packer is not None:
                sch.annotate(packer, PREPROC_ANNOTATION, True)
        return True


def pack_buffer(sch: Schedule, func_name: str, buffer: tirx.Buffer) -> Any:
    """Copy ``buffer`` (``cache_read``) into the layout its only reading block walks it in,
    tile by tile (``suggest_index_map`` over the final loop nest), and make that block read
    the copy. Returns the copying block, or None when the buffer is read by several blocks
    or loads, TVM suggests no layout, or a sketch packed it already (its one reader is a
    packing block: ``int8_dot``'s weights)."""
    reads = _reads_of(sch.mod[func_name], buffer)
    if len(reads) != 1:
        logger.debug("packing of %s skipped: read %d times", buffer.name, len(reads))
        return None
    read = reads[0]
    if PREPROC_ANNOTATION in A.node(sch, sch.get_sblock(read.block, func_name)).annotations:
        return None
    padder = _pack_padded_copy(sch, func_name, buffer, read)
    if padder is not None:
        return padder
    index_map = suggest_index_map(buffer, read.indices, read.loops, read.predicate)
    if index_map is None:
        return None
    block = sch.get_sblock(read.block, func_name)
    packer = sch.cache_read(block, read.read_index, "global")
    sch.transform_layout(block, ("read", read.read_index), index_map)
    return packer


def _pack_padded_copy(sch: Schedule, func_name: str, buffer: tirx.Buffer, read: _Read) -> Any:
    """Where ``buffer``'s one reader is a zero-padded copy of it at the function's top level
    (``pad_einsum``'s, for a padded sketch): that copy becomes the packing block, writing
    the padded weight in the order its one reader walks it. Returns the copying block, or
    None where the reader is no such copy (the copy would otherwise run in every call: a
    1x288 by 288x72 matmul padded to 80 columns took 25 us against 6.7 untuned; AMD EPYC
    Zen 4)."""
    func = sch.mod[func_name]
    block = sch.get_sblock(read.block, func_name)
    blk = A.node(sch, block)
    if (len(blk.reads) != 1 or len(blk.writes) != 1 or not A.is_spatial(sch, block)
            or not read.loops or not _at_top_level(func, read.loops[0])):
        return None
    padded = blk.writes[0].source
    if padded.same_as(buffer) or not _encloses(padded, buffer):
        return None
    readers = _reads_of(func, padded)
    if len(readers) != 1:
        return None
    reader = readers[0]
    index_map = suggest_index_map(padded, reader.indices, reader.loops, reader.predicate)
    if index_map is not None:
        sch.transform_layout(sch.get_sblock(reader.block, func_name),
                             ("read", reader.read_index), index_map)
    return block


def _encloses(padded: tirx.Buffer, buffer: tirx.Buffer) -> bool:
    """Whether ``padded`` has ``buffer``'s rank and constant dimensions at least as large."""
    dims = [(A._const_int(p), A._const_int(b)) for p, b in zip(padded.shape, buffer.shape)]
    return len(padded.shape) == len(buffer.shape) and all(
        p is not None and b is not None and p >= b for p, b in dims)


def _at_top_level(func: tirx.PrimFunc, loop: tirx.For) -> bool:
    """Whether ``loop`` is one of the statements of the function's root block."""
    body = func.body.block.body if isinstance(func.body, tvm.s_tir.SBlockRealize) else func.body
    stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    return any(stmt.same_as(loop) for stmt in stmts)


def has_layout_rewrite(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` holds a block annotated as a layout-rewrite preprocessing block."""
    hits: list[bool] = []
    tvm_ffi.structural_walk(func.body, [(
        tvm.s_tir.SBlock,
        lambda block: hits.append(True) if PREPROC_ANNOTATION in block.annotations else None)])
    return bool(hits)


@dataclass
class PrepackPlan:
    """How to run a kernel whose weights were packed: call ``func`` (exported next to
    ``main``) on the original weights ``args`` followed by fresh tensors of ``shapes`` /
    ``dtypes``; those tensors replace the weights at positions ``args`` in ``main``'s
    arguments."""

    func: str
    args: list[int]
    shapes: list[list[int]]
    dtypes: list[str]

    def to_json(self) -> dict:
        """Plain JSON (travels to measurement workers next to the artifact)."""
        return {"func": self.func, "args": self.args, "shapes": self.shapes,
                "dtypes": self.dtypes}

    @staticmethod
    def from_json(data: dict) -> "PrepackPlan":
        """The inverse of ``to_json``."""
        return PrepackPlan(str(data["func"]), [int(i) for i in data["args"]],
                           [[int(d) for d in s] for s in data["shapes"]],
                           [str(t) for t in data["dtypes"]])


def _written_params(func: tirx.PrimFunc) -> set[str]:
    names: set[str] = set()
    tvm_ffi.structural_walk(func.body, [(tirx.BufferStore,
                                          lambda store: names.add(str(store.buffer.name)))])
    return {str(p.name) for p in func.params if str(p.name) in names}


def split_layout_rewrite(func: tirx.PrimFunc, pack_name: str = "main_prepack"
                         ) -> tuple[tirx.PrimFunc, tirx.PrimFunc, PrepackPlan] | None:
    """Split a scheduled function holding layout-rewrite blocks into the kernel (reading
    packed weights) and the packing function, with TVM's ``SplitLayoutRewritePreproc`` on a
    one-call Relax wrapper. None when ``func`` has no rewrite block or a shape the wrapper
    cannot express (outputs that are not the trailing parameters, symbolic shapes)."""
    from tvm import relax  # only candidates with packed weights need Relax here

    if not has_layout_rewrite(func):
        return None
    params = list(func.params)
    written = _written_params(func)
    n_out = len(written)
    if n_out == 0 or {str(p.name) for p in params[len(params) - n_out:]} != written:
        return None
    try:
        def tensor_type(p: Any) -> Any:
            return relax.TensorType([int(d) for d in p.shape], str(p.dtype))

        bb = relax.BlockBuilder()
        gv = bb.add_func(func.without_attr("global_symbol"), "kernel")
        inputs = [relax.Var(str(p.name), tensor_type(p)) for p in params[:len(params) - n_out]]
        outs = [tensor_type(p) for p in params[len(params) - n_out:]]
        with bb.function("main", inputs):
            with bb.dataflow():
                call = relax.call_tir(gv, inputs, outs if n_out > 1 else outs[0])
                result = bb.emit_output(bb.emit(call))
            bb.emit_func_output(result)
        split = relax.transform.SplitLayoutRewritePreproc()(bb.get())
    except Exception as err:  # noqa: BLE001 - an odd function is measured unsplit
        logger.debug("layout rewrite not split: %s", err)
        return None
    calls = []
    for block in split["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and len(value.args) >= 2 and \
                    isinstance(value.args[0], tvm.ir.GlobalVar):
                calls.append((binding.var, value.args[0], list(value.args[1].fields)))
    if len(calls) != 2:
        return None
    (packed_var, pack_gv, pack_args), (_, kernel_gv, kernel_args) = calls
    positions = [inputs.index(a) for a in pack_args if a in inputs]
    if len(positions) != len(pack_args):
        return None
    pack = split[pack_gv]
    packed_params = list(pack.params)[len(pack_args):]
    plan = PrepackPlan(pack_name, positions,
                       [[int(d) for d in p.shape] for p in packed_params],
                       [str(p.dtype) for p in packed_params])
    kernel = split[kernel_gv]
    # the kernel must take the packed weights exactly where the originals were
    if len(kernel_args) != len(inputs) or any(
            kernel_args[i] is not inputs[i] and not kernel_args[i].same_as(inputs[i])
            for i in range(len(inputs)) if i not in positions):
        return None
    return kernel, pack, plan


def measurable_module(func: tirx.PrimFunc) -> tuple[tvm.IRModule, dict | None]:
    """The module to build for timing ``func``: ``main`` alone, or, when its schedule packs
    weights, ``main`` reading the packed weights next to the packing function, with the plan
    (``PrepackPlan.to_json()``) a runner needs to pack the inputs once before timing."""
    split = split_layout_rewrite(func)
    if split is None:
        return tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), None
    kernel, pack, plan = split
    return tvm.IRModule({"main": kernel.with_attr("global_symbol", "main"),
                         plan.func: pack.with_attr("global_symbol", plan.func)}), plan.to_json()
