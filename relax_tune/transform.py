"""The passes users put in their pipelines, and the "relax_tune" pipeline.

- ``TuneIRMod``: tune the TIR functions called from a Relax module (writes records only).
- ``TuneTIR``: tune every TIR function of a module, one shared budget (writes records only).
- ``ApplyDatabase``: replace each TIR function that has a record by its best schedule.
- ``ExtractTasks``: list the tasks, leave the module unchanged.

All are module passes registered with TVM's pass infrastructure, usable in
``tvm.ir.transform.Sequential``; the target comes from an argument or the ``with target:``
scope. Errors a user can fix raise ``RelaxTuneError``; an unexpected failure inside tuning
or inside applying one function is logged and the compilation goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import tvm
from tvm import relax, tirx

from .config import TuneConfig, make_config
from .database import Database, is_baseline
from . import dynamic
from .dynamic.plan import read_plans, served_ranges
from .dynamic.rank import bucket_records, ranking_for, read_rankings
from .tuning.extract import Task, dynamic_base, dynamic_workloads, extract_tasks, upper_bounds
from .lowering.prepare import (  # noqa: F401 (bind_params, lowering_passes: re-exported for scripts)
    backend_pipeline, bind_params, default_prepack, lower_for_tuning, lowering_passes)
from .report import TaskReport
from .search import candidate_key
from .tuning.tune import tune_tasks
from .utils import RelaxTuneError, dynamic_shape_vars, normalize_mod, parse_target
from .work_dir import check_work_dir, hinted_sizes, open_for_apply

logger = logging.getLogger("relax_tune.transform")


def _tune_module(mod: tvm.IRModule, target, work_dir, database, params,
                 config: TuneConfig) -> list[TaskReport]:
    """Tune the tasks of ``mod`` (params bound and folded first) into work_dir/database.
    A user's mistake (RelaxTuneError) stops the compilation; an internal failure is logged
    and the compilation goes on with the records written so far."""
    target = parse_target(target)
    tasks = extract_tasks(mod, target, op_names=config.op_names, params=params,
                          shape_hints=config.shape_hints)
    if not tasks:
        logger.warning("nothing to tune: no static-shape TIR function found")
        return []
    try:
        return tune_tasks(tasks, work_dir, config, database=database)
    except RelaxTuneError:
        raise
    except Exception:  # never crash the user's compilation: records written so far are kept
        logger.exception("tuning stopped by an internal error; the compilation continues with "
                         "the records written so far")
        return []


def _session(work_dir, config: TuneConfig | None, options: dict) -> TuneConfig:
    """The pass's validated configuration: a misspelled option or a work_dir that is a file
    stops the user at the pass's construction, before any work."""
    if work_dir is not None:
        check_work_dir(work_dir)
    return make_config(config, **options)


@tvm.transform.module_pass(opt_level=0, name="relax_tune.TuneIRMod")
class TuneIRMod:
    """Tune the TIR functions called (``call_tir``) from a Relax module.

    Parameters
    ----------
    params: ``{name: array}`` bound into the Relax functions, and what depends only on them
        folded, before extracting tasks (or None): the tasks are then the kernels a model
        compiled with those params runs (no weight transposes).
    work_dir: the session's directory: database, cost model, logs, task names
        (``relax_tune.work_dir``; created if missing).
    max_trials_global: trials shared by all tasks.
    max_trials_per_task: cap per task (default: the global budget).
    op_names: keep only tasks whose name contains any of these strings.
    target: Target/str/dict; default the ``with target:`` scope.
    database: a Database to write records to instead of work_dir's files.
    config: a ``TuneConfig``; ``**options`` (any ``TuneConfig`` field: num_trials_per_iter,
        runner, strategy, seed, ...) replace its values. An unknown option raises
        ``RelaxTuneError`` here, before any work.

    The module is returned unchanged; ``reports`` holds one ``TaskReport`` per task afterwards.
    """

    def __init__(self, params: dict | None = None, work_dir: str | None = None,
                 max_trials_global: int = 64, max_trials_per_task: int | None = None,
                 op_names: Sequence[str] | None = None, target=None,
                 database: Database | None = None, config: TuneConfig | None = None,
                 **options):
        self.config = _session(work_dir, config, dict(
            options, max_trials_global=max_trials_global,
            max_trials_per_task=max_trials_per_task, op_names=op_names))
        self.params, self.work_dir, self.database, self.target = params, work_dir, database, target
        self.reports: list[TaskReport] = []

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Tune, write records, return ``mod`` unchanged."""
        self.reports = _tune_module(mod, self.target, self.work_dir, self.database,
                                    self.params, self.config)
        return mod


@tvm.transform.module_pass(opt_level=0, name="relax_tune.TuneTIR")
class TuneTIR:
    """Tune every TIR function of the module with one shared budget and one database.

    Same parameters as ``TuneIRMod`` except ``params``; unlike MetaSchedule's TuneTIR it
    accepts ``op_names`` and does not give each function the whole budget.
    The module is returned unchanged; ``reports`` holds the per-task results afterwards.
    """

    def __init__(self, work_dir: str | None = None, max_trials_global: int = 64,
                 max_trials_per_task: int | None = None, op_names: Sequence[str] | None = None,
                 target=None, database: Database | None = None,
                 config: TuneConfig | None = None, **options):
        self.config = _session(work_dir, config, dict(
            options, max_trials_global=max_trials_global,
            max_trials_per_task=max_trials_per_task, op_names=op_names))
        self.work_dir, self.database, self.target = work_dir, database, target
        self.reports: list[TaskReport] = []

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Tune, write records, return ``mod`` unchanged."""
        prims = tvm.IRModule({gv: f for gv, f in mod.functions.items()
                              if isinstance(f, tirx.PrimFunc)})
        self.reports = _tune_module(prims, self.target, self.work_dir, self.database, None,
                                    self.config)
        return mod


@tvm.transform.module_pass(opt_level=0, name="relax_tune.ExtractTasks")
class ExtractTasks:
    """Collect the tuning tasks into ``self.tasks``; the module passes through unchanged."""

    def __init__(self, target=None, op_names: Sequence[str] | None = None,
                 params: dict | None = None, shape_hints=None):
        self.target, self.op_names, self.params = target, op_names, params
        self.shape_hints = dynamic.normalize_hints(shape_hints)
        self.tasks: list[Task] = []

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Extract the tasks of ``mod`` and return it unchanged."""
        self.tasks = extract_tasks(mod, self.target, op_names=self.op_names, params=self.params,
                                   shape_hints=self.shape_hints)
        return mod


@tvm.transform.module_pass(opt_level=0, name="relax_tune.ApplyDatabase")
class ApplyDatabase:
    """Replace each TIR function that has a tuning record by its best schedule.

    Parameters
    ----------
    work_dir: directory of the JSON database (``database_workload.json`` ...).
    database: a Database instead; default the current ``with db:`` one.
    enable_warning: log a warning for every function without a record.
    target: Target/str/dict; default the ``with target:`` scope. Only records made for a
        compatible target are used.
    shape_hints: sizes of symbolic variables to look records up at (as ``TuneIRMod``'s);
        the sizes tuned into ``work_dir`` (its ``tasks.json``) and the default sizes are
        looked up as well.

    A function with symbolic dimensions that has records at some sizes (its buckets)
    becomes one function that dispatches on the symbolic value: the nearest bucket (log
    scale) runs its best schedule replayed on the symbolic function (predicated tiles,
    correct at every size), and sizes above every bucket run the untuned function
    (``relax_tune.dynamic``; CPU targets). Without records it is left unchanged.

    The input module is never mutated. Replaced functions keep their attributes and get
    ``tirx.is_scheduled``; functions already scheduled, without records, or whose record
    fails to replay are left as they were, and so is a function whose best record is its
    untuned baseline (no tuned schedule beat it). Afterwards ``applied`` lists the replaced
    names and ``kept`` the functions kept because their baseline won.
    """

    def __init__(self, work_dir: str | None = None, database: Database | None = None,
                 enable_warning: bool = False, target=None, shape_hints=None):
        self.work_dir, self.database = work_dir, database
        self.enable_warning, self.target = enable_warning, target
        self.shape_hints = dynamic.normalize_hints(shape_hints)
        self.applied: list[str] = []
        self.kept: list[str] = []

    def _database(self) -> Database:
        if self.database is not None:
            return self.database
        if self.work_dir is not None:  # read only: applying never creates files
            return open_for_apply(self.work_dir)
        current = Database.current()
        if current is None:
            raise RelaxTuneError("ApplyDatabase needs work_dir=..., database=..., or a "
                                 "`with database:` scope")
        return current

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        """Return a copy of ``mod`` with the tuned functions swapped in."""
        target = parse_target(self.target)
        db = self._database()
        out = mod.clone()
        self.applied, self.kept = [], []
        bounds = upper_bounds(mod)
        side: tuple[dict, dict] | None = None  # the work_dir's ranking and plan, read once
        for gv, func in mod.functions.items():
            if not isinstance(func, tirx.PrimFunc):
                continue
            if func.attrs is not None and func.attrs.get("tirx.is_scheduled", False):
                continue
            if dynamic_shape_vars(func):
                if side is None:
                    side = read_rankings(self.work_dir), read_plans(self.work_dir)
                new = self._apply_dynamic(db, gv.name_hint, func, target, bounds, *side)
            else:
                new = self._apply_one(db, gv.name_hint, func, target)
            if new is not None:
                out.update_func(gv, new)
                self.applied.append(gv.name_hint)
        return out

    def _lookup_sizes(self, func: tirx.PrimFunc, bounds: dict[str, int]) -> dict[str, dict]:
        """The sizes to look records up at, per symbolic variable of ``func``."""
        tuned = hinted_sizes(self.work_dir)
        out = {}
        for name in (v.name for v in dynamic.symbolic_vars(func)):
            sizes = set(dynamic.default_sizes(bounds.get(name))) | tuned.get(name, set())
            sizes |= set((self.shape_hints or {}).get(name, {}))
            out[name] = {size: 1.0 for size in sorted(sizes)}
        return out

    def _apply_dynamic(self, db: Database, name: str, func: tirx.PrimFunc, target,
                       bounds: dict[str, int], rankings: dict, plans: dict
                       ) -> tirx.PrimFunc | None:
        """The dispatching function of a symbolic ``func`` built from the records of its
        buckets (in the order of the work_dir's ``rankings``, serving the sizes its
        ``plans`` say), or None (no bucket has a record, or it cannot be built)."""
        if target.kind.name != "llvm":
            # One kernel with an if/else over n cannot hold GPU branches that synchronise
            # threads (TVM: "Cannot insert syncs inside condition"); dlight schedules it.
            logger.info("%s: dynamic-shape dispatch is built for CPU targets only; left to "
                        "the default schedules on %s", name, target.kind.name)
            return None
        try:
            specialised = dynamic_workloads(func, self._lookup_sizes(func, bounds), bounds)
        except RelaxTuneError as err:
            logger.info("%s: dynamic shape that cannot be specialised (%s); left unchanged",
                        name, err)
            return None
        base = normalize_mod(dynamic_base(func))
        branches, tuned, kept, keys = [], [], [], []
        for bucket, workload in specialised:
            try:
                record = db.query_tuning_record(workload, target)
            except Exception as err:  # a bad record must not break the compilation
                logger.warning("%s[%s]: could not read its tuning record (%s)", name,
                               bucket.label, err)
                continue
            if record is None:
                continue
            branch, key = None, None
            if not is_baseline(record):
                chosen = _bucket_branch(db, workload, target, base, record,
                                        f"{name}[{bucket.label}]", dict(bucket.sizes),
                                        ranking_for(rankings, workload, dict(bucket.sizes)))
                if chosen is not None:
                    branch, key = chosen
                    tuned.append(bucket.label)
            if branch is None:
                kept.append(bucket.label)
            branches.append((dict(bucket.sizes), branch))
            keys.append(key)
        if not branches:
            if self.enable_warning:
                logger.warning("%s: no tuning record at any size of its symbolic shape; left "
                               "unchanged", name)
            return None
        if not tuned:
            self.kept.append(name)
            return None
        served = served_ranges(plans, base, branches, keys, name)
        try:
            if served is not None:
                try:
                    new = dynamic.dispatch_function(base["main"], branches, served=served)
                except Exception as err:  # the nearest bucket serves each size then
                    logger.warning("%s: dispatch plan not followed (%s); each size runs its "
                                   "nearest bucket's kernel", name, err)
                    served = None
            if served is None:
                new = dynamic.dispatch_function(base["main"], branches)
        except Exception as err:  # never crash the compilation: the function stays untuned
            logger.warning("%s: dispatching function not built (%s); left unchanged", name,
                           err)
            return None
        logger.info("%s: dispatch over %s (tuned: %s; untuned: %s and above the largest)",
                    name, ", ".join(dynamic.Bucket(tuple(s.items())).label
                                    for s, _ in branches),
                    ", ".join(tuned), ", ".join(kept) or "none")
        return _with_attrs_of(new, func)

    def _apply_one(self, db: Database, name: str, func: tirx.PrimFunc,
                   target) -> tirx.PrimFunc | None:
        try:
            sch = db.query_schedule(normalize_mod(func), target)
        except Exception as err:  # a bad record must not break the compilation
            logger.warning("%s: could not apply its tuning record (%s); keeping it as it was",
                           name, err)
            return None
        if sch is None:
            if self.enable_warning:
                logger.warning("%s: no tuning record for target %s; left unchanged", name,
                               target.kind.name)
            return None
        if is_baseline(sch):
            # The best record is the task's baseline: no tuned schedule beat it, so the
            # function stays exactly as it was (on a GPU the pipeline's dlight pass then
            # gives it the default schedule its baseline was timed with).
            self.kept.append(name)
            return None
        return _with_attrs_of(sch.mod["main"], func)


def _bucket_branch(db: Database, workload: tvm.IRModule, target, base: tvm.IRModule,
                   best, label: str, sizes: dict[str, int],
                   ranking: dict[str, float | None] | None = None
                   ) -> tuple[tirx.PrimFunc, str] | None:
    """The bucket's fastest schedule that replays on the symbolic function ``base``, and
    its record's key; None (the untuned function serves the bucket) when none faster than
    the untuned one does. Records in the order of ``dispatch_rank.bucket_records``. Not
    every static schedule survives symbolic extents: a reduction split by a factor that
    does not divide ``n`` (rfactor) is no longer quasi-affine, and TVM refuses to
    decompose it; the next record is tried then."""
    errors = []
    records = bucket_records(db, workload, target, best, ranking, label)
    for record in records:
        try:
            return (dynamic.replay_symbolic(base, record.trace_json, sizes),
                    candidate_key(record.trace_json))
        except Exception as err:
            errors.append(str(err).strip().splitlines()[0] if str(err).strip() else
                          type(err).__name__)
    if records:
        logger.warning("%s: none of its %d fastest schedules replays on the symbolic "
                       "function (%s); the untuned function serves its sizes", label,
                       len(errors), "; ".join(errors[:2]))
    return None


def _with_attrs_of(new: tirx.PrimFunc, func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A scheduled ``new`` carrying ``func``'s attributes (and no global symbol where it
    had none), marked ``tirx.is_scheduled``."""
    if func.attrs is not None:
        new = new.with_attrs(func.attrs)
    if func.attrs is None or "global_symbol" not in func.attrs:
        new = new.without_attr("global_symbol")
    return new.with_attr("tirx.is_scheduled", True)


def _without_transform_params(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` minus the lifted ``*_transform_params`` functions: their kernels run once per
    weight set, not per call, so they are not worth tuning trials."""
    return tvm.IRModule({gv: f for gv, f in mod.functions.items()
                         if not gv.name_hint.endswith("_transform_params")})


def relax_tune_pipeline(target=None, work_dir: str = "relax_tune_work",
                        max_trials_global: int = 64, max_trials_per_task: int | None = None,
                        op_names: Sequence[str] | None = None, params: dict | None = None,
                        lift_transform_params: bool = False,
                        cpu_weight_prepack: bool | None = None, winograd: bool = True,
                        config: TuneConfig | None = None, **options) -> tvm.transform.Pass:
    """The "relax_tune" pipeline: prepare the weights, lower, tune, apply the database,
    finish the build pipeline. Use it as the ``relax_pipeline`` of ``tvm.compile``::

        ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
            "relax_tune", target=target, work_dir="work", max_trials_global=64,
            params={name: array, ...}))
        vm = relax.VirtualMachine(ex, tvm.cpu()); out = vm["forward"](x)

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
    (``relax_tune.space.layout_rewrite``); kernels are measured on packed weights, the
    packing itself runs once, at compile time (``params``) or in ``<func>_transform_params``.

    ``winograd`` (llvm targets): 3x3 stride-1 convolutions on feature maps of at least
    ``winograd.MIN_SIZE`` pixels a side, with bound weights, are computed by Winograd
    F(4x4, 3x3) (``relax_tune.winograd``): a gather, two transform matmuls and a batched GEMM
    with 4x fewer multiplications than the convolution. ``False`` keeps the convolutions;
    the tasks differ, so a work_dir tuned one way does not serve the other.

    GPU targets (``cuda``): functions without a tuning record get ``tvm.s_tir.dlight``'s
    default schedules (Matmul, GEMV, Reduction, GeneralReduction, Fallback), so the compiled
    model always runs. With ``max_trials_global=0`` the pipeline only applies the records
    already in ``work_dir``. ``config``/``options`` describe the tuning session as for
    ``TuneIRMod`` (an unknown option raises ``RelaxTuneError`` when the pipeline is made).
    """
    if cpu_weight_prepack and params is None and not lift_transform_params:
        raise RelaxTuneError("cpu_weight_prepack=True needs params={...} (prepack at compile "
                             "time) or lift_transform_params=True (prepack in "
                             "<func>_transform_params)")

    tuner = TuneIRMod(work_dir=work_dir, config=config, max_trials_global=max_trials_global,
                      max_trials_per_task=max_trials_per_task, op_names=op_names, **options)

    @tvm.transform.module_pass(opt_level=0, name="relax_tune.pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        tgt = parse_target(target)
        backend = backend_pipeline(tgt)
        prepack = default_prepack(tgt, params, lift_transform_params) \
            if cpu_weight_prepack is None else cpu_weight_prepack
        # Lifting before tuning makes the tasks those of the bound model (weight-only work
        # is out of the kernels); with prepacking a second lift after the split adds the
        # packing to the same <func>_transform_params.
        mod = lower_for_tuning(mod, tgt, params, lift_transform_params, prepack, winograd)
        with tgt:
            if max_trials_global > 0:
                tuner(_without_transform_params(mod))
            post = [ApplyDatabase(work_dir=work_dir, shape_hints=tuner.config.shape_hints)]
            if prepack:
                post += [relax.transform.SplitLayoutRewritePreproc(),
                         *([relax.transform.LiftTransformParams()]
                           if lift_transform_params else []),
                         relax.transform.FoldConstant()]
            if tgt.kind.name == "cuda":
                from .space.gpu import default_schedule_pass, ensure_cuda_compiler

                ensure_cuda_compiler()  # this process builds CUDA kernels now
                post.append(default_schedule_pass())
            return tvm.transform.Sequential([
                *post,
                *backend.dataflow_lower_passes(tgt),
                *backend.finalize_passes(tgt),
            ])(mod)

    return _pipeline


def register_pipeline() -> None:
    """Register ``relax_tune_pipeline`` as ``relax.get_pipeline("relax_tune", ...)`` (once)."""
    if "relax_tune" not in relax.pipeline.PIPELINE_MAP:
        relax.register_pipeline("relax_tune")(relax_tune_pipeline)
