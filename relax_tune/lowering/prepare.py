"""Preparing a Relax module for tuning: one meaning of ``params`` for every entry point.

``params={name: array}`` always means: bind the arrays as constants and fold what depends
only on them (weight transposes, reshapes, batch norms folded into convolutions), so the
tasks are the kernels a model compiled with those params runs.

- ``bind_and_fold(mod, params, target)``: for a module that is already lowered (legalized,
  fused: what ``TuneIRMod``, ``tune_relax`` and ``extract_tasks`` receive).
- ``lower_for_tuning(mod, target, params, ...)``: for a module as exported from a frontend
  (what the "relax_tune" pipeline, the command line and the demo receive): bind, then
  ``lowering_passes``.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from .attention_fusion import FuseAttention
from .fast_math import FastMath
from .flatten_matmul import FlattenMatmulRows
from .im2col import ColumnsForFewChannels, column_group_bytes
from .int8 import IntegerQDQ
from .int8_pairs import MarkNarrowWeightPairs
from .int8_tables import FusibleTableLookups
from .graph import (ChannelsLastConvolutions, FoldBatchNormIntoConv, PatchConvToMatmul,
                    PointwiseConvToMatmul)
from .raise_elementwise import RaiseElementwiseCalls
from .shape_bounds import SimplifyBoundedShapes
from .take_mode import ClippedTakes
from .winograd import WinogradConvolutions
from ..space.params import target_params
from ..utils import RelaxTuneError, parse_target


def bind_params(mod: tvm.IRModule, params: dict) -> tvm.IRModule:
    """Bind ``params`` (``{parameter name: numpy array or tvm Tensor}``) as constants into
    every Relax function that has parameters of those names; the functions lose those
    parameters. A name that no Relax function has raises ``RelaxTuneError``."""
    if not isinstance(params, dict):
        raise RelaxTuneError(
            f"params must be a dict {{parameter name: array}}, not {type(params).__name__}; "
            "for export_tvm's list write {name: array for name, array in ...}")
    names: set[str] = set()
    out = mod
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        mine = {p.name: params[p.name] for p in func.params if p.name in params}
        names.update(mine)
        if mine:
            out = relax.transform.BindParams(gv.name_hint, {
                k: v if isinstance(v, tvm.runtime.Tensor) else tvm.runtime.tensor(v)
                for k, v in mine.items()})(out)
    unknown = sorted(set(params) - names)
    if unknown:
        raise RelaxTuneError(f"params {unknown} match no parameter of the module's Relax "
                             "functions; pass the names export_tvm returned")
    return out


def bind_and_fold(mod: tvm.IRModule, params: dict | None, target: Any = None) -> tvm.IRModule:
    """``mod`` (already lowered) with ``params`` bound and what depends only on them folded;
    ``mod`` itself when there are none."""
    if not params:
        return mod
    with parse_target(target):
        return relax.transform.FoldConstant()(bind_params(mod, params))


def backend_pipeline(target: tvm.target.Target):
    """TVM's backend pipeline module of the target kind (its library dispatch, dataflow
    lowering and finalize passes); RelaxTuneError for a kind relax_tune does not compile."""
    kind = target.kind.name
    if kind == "llvm":
        return relax.backend.cpu_generic.pipeline
    if kind == "cuda":
        return relax.backend.cuda.pipeline
    raise RelaxTuneError(f"the relax_tune pipeline supports llvm and cuda targets, not {kind!r}")


def graph_passes(target: tvm.target.Target | None = None, winograd: bool = True,
                 int8: bool = True) -> list[tvm.transform.Pass]:
    """Graph-level work done before any kernel exists, as ONNX Runtime does before its
    kernels run: elementwise kernels written at import (TVM's ONNX ``Clip``) become Relax
    operators again (``raise_elementwise.RaiseElementwiseCalls``), the quantized
    convolutions and matmuls of a QDQ model are computed in integers unless ``int8`` is
    False (``int8.IntegerQDQ``; first, while the quantized weights are still constants of
    their own; the pipeline resolves its ``int8="auto"`` to True or False first,
    ``relax_tune.int8_choice``), shapes are simplified with the bounds of their symbolic variables
    (``shape_bounds.SimplifyBoundedShapes``), batch norms after convolutions are folded into
    the convolutions' weights and bias (with bound weights the scale and shift are
    constants, folded at compile time), the remaining batch norms and layer norms are
    decomposed into arithmetic that fuses into neighbouring kernels, 3-D float projections
    become 2-D on CPU targets (``flatten_matmul.FlattenMatmulRows``), patch convolutions
    (stride = kernel, a ViT's patch embedding) become matmuls, convolutions take the
    channels-last layout on CPU targets (``graph.ChannelsLastConvolutions``), and there 1x1
    ones of output channels that fill no whole SIMD registers become matmuls
    (``graph.PointwiseConvToMatmul``), integer
    convolutions of an image's few channels run on its im2col columns
    (``im2col.ColumnsForFewChannels``, CPU targets), large 3x3
    stride-1 convolutions are computed by Winograd's algorithm on CPU targets unless
    ``winograd`` is False (``winograd.WinogradConvolutions``), and constants are folded."""
    cpu = target is not None and target.kind.name == "llvm"
    return [
        ClippedTakes(),  # no "fast" take: no out-of-bounds read, no warning per legalization
        RaiseElementwiseCalls(),  # ONNX's Clip, imported as kernels: operators again
        *([IntegerQDQ()] if int8 else []),
        SimplifyBoundedShapes(),  # a position table sliced to a bounded sequence length
        relax.transform.FoldConstant(),  # bias reshapes of bound weights become constants
        FoldBatchNormIntoConv(),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.CanonicalizeBindings(),
        *([FlattenMatmulRows()] if cpu else []),  # ONNX's 3-D projections: 2-D, as torch's
        PatchConvToMatmul(),
        *([ChannelsLastConvolutions()] if cpu else []),
        relax.transform.FoldConstant(),
        *([PointwiseConvToMatmul(target_params(target).lanes("float32"))] if cpu else []),
        *([ColumnsForFewChannels(column_group_bytes(target))] if cpu and int8 else []),
        *([WinogradConvolutions(lanes=target_params(target).lanes("float32")),
          relax.transform.FoldConstant()] if cpu and winograd else []),
    ]


def lowering_passes(target: tvm.target.Target, lift_transform_params: bool = False,
                    cpu_weight_prepack: bool = False,
                    winograd: bool = True, int8: bool = True) -> list[tvm.transform.Pass]:
    """The passes the "relax_tune" pipeline runs before tuning (graph passes, on CPU
    targets each attention grouped into one kernel: ``attention.FuseAttention``, legalize,
    fuse, FuseTIR, and on CPU targets vectorisable exp/erf/tanh/sigmoid: ``FastMath``, and
    the integer kernels whose weights ``vpmaddubsw`` takes exactly marked:
    ``MarkNarrowWeightPairs``).

    A model lowered with them (inside ``with target:``, after ``bind_params`` when the
    pipeline gets ``params``) has exactly the tasks the pipeline tunes and applies, so tuning
    it separately (``relax-tune tune``) fills the database the pipeline then uses.
    ``lift_transform_params`` moves weight-only work into ``<func>_transform_params``;
    ``cpu_weight_prepack`` marks the weights layout-free (see ``relax_tune_pipeline``);
    ``winograd``, ``int8`` see ``graph_passes``."""
    return [
        *graph_passes(target, winograd, int8),
        *([relax.transform.LiftTransformParams()] if lift_transform_params else []),
        *backend_pipeline(target).library_dispatch_passes(target),
        *([FuseAttention()] if target.kind.name == "llvm" else []),
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        *([FusibleTableLookups()] if int8 else []),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        # reshapes of contiguous tensors become views here, as the backend makes them later:
        # as kernels they would be tasks that never run
        relax.transform.RewriteDataflowReshape(),
        relax.transform.DeadCodeElimination(),
        *([FastMath()] if target.kind.name == "llvm" else []),
        *([MarkNarrowWeightPairs(target)] if int8 and target.kind.name == "llvm" else []),
        *([relax.transform.AttachAttrLayoutFreeBuffers()] if cpu_weight_prepack else []),
    ]


def has_num_input(mod: tvm.IRModule) -> bool:
    """Whether a Relax function of ``mod`` says how many of its inputs are not weights
    (``num_input``, set by ``export_tvm``): what ``LiftTransformParams`` needs."""
    return any(isinstance(f, relax.Function) and f.attrs is not None and "num_input" in f.attrs
               for _, f in mod.functions.items())


def default_prepack(target: tvm.target.Target, params: dict | None,
                    lift_transform_params: bool) -> bool:
    """``cpu_weight_prepack``'s default: on for llvm targets when the weights are bound or
    lifted (then they are constants or per-weight-set inputs, worth packing once). ``params``
    empty but given counts as bound: an ONNX model's weights come as the module's constants
    (``load_model``), and without packing its int8 ResNet-18 (64x64, no measurement) ran
    11.5 ms instead of 3.0 (Intel Xeon, 2 threads)."""
    return (params is not None or lift_transform_params) and target.kind.name == "llvm"


def lower_for_tuning(mod: tvm.IRModule, target: Any = None, params: dict | None = None,
                     lift_transform_params: bool = False,
                     cpu_weight_prepack: bool | None = None,
                     winograd: bool = True, int8: bool = True) -> tvm.IRModule:
    """``mod`` as exported, with ``params`` bound, through ``lowering_passes``: the module
    whose tasks the "relax_tune" pipeline tunes and later looks up in the database
    (``cpu_weight_prepack`` None: ``default_prepack``; ``int8`` as ``graph_passes`` takes
    it: the pipeline resolves its ``"auto"`` first, ``relax_tune.int8_choice``)."""
    target = parse_target(target)
    prepack = default_prepack(target, params, lift_transform_params) \
        if cpu_weight_prepack is None else cpu_weight_prepack
    if params:
        mod = bind_params(mod, params)
    lift = lift_transform_params and has_num_input(mod)
    if lift_transform_params and not lift:
        raise RelaxTuneError("lift_transform_params=True needs Relax functions with a "
                             "'num_input' attribute (export_tvm sets it); add "
                             "func.with_attr('num_input', n) for n runtime inputs")
    with target:
        return tvm.transform.Sequential(lowering_passes(target, lift, prepack, winograd,
                                                           int8))(mod)
