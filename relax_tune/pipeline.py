"""The "relax_tune" pipeline: weights prepared, the module lowered, tuned and the database
applied, then TVM's backend passes; registered as ``relax.get_pipeline("relax_tune")``."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import tvm
from tvm import relax

from .config import TuneConfig
from .int8_choice import check_int8, resolve_int8
from .lowering import backend_pipeline, default_prepack, lower_for_tuning
from .transform import ApplyDatabase, TuneIRMod
from .utils import RelaxTuneError, parse_target
from .work_dir import WorkDir

logger = logging.getLogger("relax_tune.pipeline")


def _without_transform_params(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` minus the lifted ``*_transform_params`` functions: their kernels run once per
    weight set, not per call, so they are not worth tuning trials."""
    return tvm.IRModule({gv: f for gv, f in mod.functions.items()
                         if not gv.name_hint.endswith("_transform_params")})


DEFAULT_WORK_DIR = "relax_tune_work"
"""Where the pipeline keeps its records when it is given no ``work_dir`` (with a warning)."""


def relax_tune_pipeline(target=None, work_dir: "WorkDir | str | None" = None,
                        max_trials_global: int | None = None,
                        max_trials_per_task: int | None = None,
                        op_names: Sequence[str] | None = None, params: dict | None = None,
                        lift_transform_params: bool = False,
                        cpu_weight_prepack: bool | None = None, winograd: bool = True,
                        int8: bool | str = "auto",
                        config: TuneConfig | None = None, **options) -> tvm.transform.Pass:
    """The "relax_tune" pipeline: prepare the weights, lower, tune, apply the database,
    finish the build pipeline. Use it as the ``relax_pipeline`` of ``tvm.compile``::

        ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir="work", max_time=60,
            params={name: array, ...}))
        vm = relax.VirtualMachine(ex, tvm.cpu()); out = vm["forward"](x)

    Budget: ``max_time`` (seconds, the whole session) is the main knob; without it,
    ``max_trials_global`` trials (default 64). ``measure=False`` times nothing: each
    kernel gets the schedule the pre-trained model ranks first (``tuning.predict``).

    Weights, three ways:

    - ``params={name: array}`` (fastest): the arrays are bound as constants, and everything
      that depends only on them (weight transposes, reshapes, layout rewrites) is computed
      once at compile time. The compiled functions take only the remaining inputs. Changing
      the weights means compiling again.
    - ``lift_transform_params=True`` (weights stay runtime inputs, swappable without
      recompiling): TVM's ``LiftTransformParams`` moves the weight-only computations of every
      function with a ``num_input`` attribute (``export_tvm`` sets it) into
      ``<func>_transform_params``. Call it once per weight set, then pass its outputs::

          w = vm["forward_transform_params"]([tvm.runtime.tensor(a) for a in weights])
          out = vm["forward"](x, *w)

      Those lifted kernels run once, so they get no tuning trials.
    - neither (default): the module's signature is unchanged and weight transposes run on
      every call, as in TVM's static_shape_tuning pipeline.

    ``cpu_weight_prepack`` (default: on for ``llvm`` targets when ``params`` or
    ``lift_transform_params`` are given, off otherwise) marks weights as layout-free buffers
    before tuning (TVM's
    ``AttachAttrLayoutFreeBuffers``), so schedules may rewrite a weight's layout; after the
    database is applied, ``SplitLayoutRewritePreproc`` moves every block annotated
    ``meta_schedule.layout_rewrite_preproc`` out of the kernel, and it is folded at compile
    time (``params``) or lifted into ``<func>_transform_params``. It needs ``params`` or
    ``lift_transform_params``; both ways give the same tasks, so one database serves both.
    Records tuned with and without prepacking are separate workloads. The CPU space's ``RewriteLayout`` postprocessor
    packs each marked weight in the order the tuned loop nest reads it
    (``relax_tune.space.cpu.layout_rewrite``); kernels are measured on packed weights, the
    packing itself runs once, at compile time (``params``) or in ``<func>_transform_params``.

    ``winograd`` (llvm targets): 3x3 stride-1 convolutions on feature maps of at least
    ``winograd.MIN_SIZE`` pixels a side, with bound weights, are computed by Winograd
    F(4x4, 3x3), or F(2x2, 3x3) on maps under ``winograd.SMALL_TILE_BELOW`` pixels
    (``relax_tune.lowering.winograd``): the input transform's kernel, a batched GEMM with
    4x (2.25x) fewer multiplications than the convolution, and the output transform.
    ``False`` keeps the convolutions; the tasks differ, so a work_dir tuned one way does not
    serve the other.

    ``int8``: in a quantized model (QDQ: ONNX Runtime's static quantizer), ``True``
    computes the convolutions and matmuls between dequantize and quantize in integers, u8/s8
    operands with int32 accumulation and the requantisation fused as their epilogue
    (``relax_tune.lowering.int8``); ``False`` keeps TVM's float arithmetic around each
    quantize/dequantize pair; ``"auto"`` (default) takes the integer kernels where they pay
    on this machine, measured once per machine and kept (``relax_tune.int8_choice``; a
    target of another CPU takes them unmeasured). A model without quantize/dequantize is
    not changed.

    GPU targets (``cuda``): functions without a tuning record get ``tvm.s_tir.dlight``'s
    default schedules (Matmul, GEMV, Reduction, GeneralReduction, Fallback), so the compiled
    model always runs. With ``max_trials_global=0`` (and ``measure`` on) the pipeline only
    applies the records already in ``work_dir``. ``config``/``options`` describe the tuning session as for
    ``TuneIRMod`` (an unknown option raises ``RelaxTuneError`` when the pipeline is made).
    """
    check_int8(int8)
    if cpu_weight_prepack and params is None and not lift_transform_params:
        raise RelaxTuneError("cpu_weight_prepack=True needs params={...} (prepack at compile "
                             "time) or lift_transform_params=True (prepack in "
                             "<func>_transform_params)")

    assumed = work_dir is None
    work_dir = WorkDir.of(DEFAULT_WORK_DIR if assumed else work_dir)  # checked once, here
    tuner = TuneIRMod(work_dir=work_dir, config=config, max_trials_global=max_trials_global,
                      max_trials_per_task=max_trials_per_task, op_names=op_names, **options)
    if assumed:
        cfg = tuner.config
        budget = ("measures nothing" if not cfg.measure else
                  f"tunes for {cfg.max_time:g} s" if cfg.max_time is not None else
                  f"tunes {cfg.trial_budget} trials")
        logger.warning("relax_tune pipeline: no work_dir given, so it %s into %s and reuses "
                       "the records there: pass work_dir=... to choose where (and max_time=... "
                       "to set the budget)", budget, os.path.abspath(str(work_dir)))

    @tvm.transform.module_pass(opt_level=0, name="relax_tune.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        tgt = parse_target(target)
        prepack = default_prepack(tgt, params, lift_transform_params) \
            if cpu_weight_prepack is None else cpu_weight_prepack
        # Lifting before tuning makes the tasks those of the bound model (weight-only work
        # is out of the kernels); with prepacking a second lift after the split adds the
        # packing to the same <func>_transform_params.
        mod = lower_for_tuning(mod, tgt, params, lift_transform_params, prepack, winograd,
                               resolve_int8(int8, mod, tgt))
        with tgt:
            if tuner.config.trial_budget > 0 or not tuner.config.measure:
                tuner(_without_transform_params(mod))
            return finish_passes(tgt, work_dir, prepack, lift_transform_params,
                                 tuner.config.shape_hints)(mod)

    return _pipeline


def finish_passes(target: tvm.target.Target, work_dir: WorkDir, prepack: bool,
                  lift_transform_params: bool = False,
                  shape_hints=None) -> tvm.transform.Pass:
    """What the "relax_tune" pipeline runs after lowering and tuning, under ``target``: the
    work_dir's schedules applied (``ApplyDatabase``), the packed weights split out and
    folded (``prepack``) or lifted, ``dlight``'s defaults on a GPU, and TVM's backend
    passes. ``relax-tune compile`` runs it on the module it extracted the tasks from."""
    post = [ApplyDatabase(work_dir=work_dir, shape_hints=shape_hints)]
    if prepack:
        post += [relax.transform.SplitLayoutRewritePreproc(),
                 *([relax.transform.LiftTransformParams()] if lift_transform_params else []),
                 relax.transform.FoldConstant(),
                 relax.transform.CanonicalizeBindings(),
                 relax.transform.DeadCodeElimination()]
    if target.kind.name == "cuda":
        from .space.gpu import default_schedule_pass, ensure_cuda_compiler

        ensure_cuda_compiler()  # this process builds CUDA kernels now
        post.append(default_schedule_pass())
    backend = backend_pipeline(target)
    return tvm.transform.Sequential([*post, *backend.dataflow_lower_passes(target),
                                     *backend.finalize_passes(target)])


def register_pipeline() -> None:
    """Register ``relax_tune_pipeline`` as ``relax.get_pipeline("relax_tune", ...)`` (once)."""
    if "relax_tune" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("relax_tune")(relax_tune_pipeline)
