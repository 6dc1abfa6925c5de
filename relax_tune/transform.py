"""The passes users put in their pipelines (the "relax_tune" pipeline that chains them is
``relax_tune.pipeline``).

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
from tvm import tirx

from .config import TuneConfig, make_config
from .database import Database, is_baseline
from . import dynamic
from .dynamic.apply import apply_dynamic
from .dynamic.plan import read_plans
from .dynamic.rank import read_rankings
from .dynamic.workloads import upper_bounds
from .tuning.extract import Task, extract_tasks
from .lowering import bind_params, lower_for_tuning, lowering_passes  # noqa: F401 (for scripts)
from .tuning.state import TaskReport
from .tuning.tune import tune_tasks
from .utils import (RelaxTuneError, dynamic_shape_vars, normalize_mod, parse_target,
                    structural_hash)
from .work_dir import WorkDir

logger = logging.getLogger("relax_tune.transform")


def _tune_module(mod: tvm.IRModule, target, work_dir: WorkDir | None, database, params,
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


def _session(config: TuneConfig | None, options: dict) -> TuneConfig:
    """The pass's validated configuration: a misspelled option stops the user at the pass's
    construction, before any work. The budget arguments left at None keep ``config``'s."""
    budgets = ("max_trials_global", "max_trials_per_task", "op_names")
    return make_config(config, **{k: v for k, v in options.items()
                                  if v is not None or k not in budgets})


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
    max_trials_global: trials shared by all tasks (default: 64, or no limit with a
        ``max_time``: then the time is the budget).
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
                 max_trials_global: int | None = None, max_trials_per_task: int | None = None,
                 op_names: Sequence[str] | None = None, target=None,
                 database: Database | None = None, config: TuneConfig | None = None,
                 **options):
        self.config = _session(config, dict(
            options, max_trials_global=max_trials_global,
            max_trials_per_task=max_trials_per_task, op_names=op_names))
        self.work_dir = WorkDir.maybe(work_dir)  # a path that is a file stops the user here
        self.params, self.database, self.target = params, database, target
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

    def __init__(self, work_dir: str | None = None, max_trials_global: int | None = None,
                 max_trials_per_task: int | None = None, op_names: Sequence[str] | None = None,
                 target=None, database: Database | None = None,
                 config: TuneConfig | None = None, **options):
        self.config = _session(config, dict(
            options, max_trials_global=max_trials_global,
            max_trials_per_task=max_trials_per_task, op_names=op_names))
        self.work_dir = WorkDir.maybe(work_dir)  # a path that is a file stops the user here
        self.database, self.target = database, target
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

    A function without a measured record takes the work_dir's predicted schedule, if it has
    one (``database.predicted``: the cost model's first choice, from a ``measure=False``
    session or one whose time limit ended before the task was measured); ``predicted``
    lists those (they are in ``applied`` too).

    ``unknown`` lists the static functions whose workload is in neither store of
    ``work_dir`` (they run as lowered). When they are a quarter or more of those looked up
    in a work_dir that holds records, it was tuned for something else (another model,
    another relax_tune version's lowering, another target's tasks) and a warning says so:
    compiling from it would give an untuned model with no other sign.
    """

    def __init__(self, work_dir: str | None = None, database: Database | None = None,
                 enable_warning: bool = False, target=None, shape_hints=None):
        self.work_dir, self.database = WorkDir.maybe(work_dir), database
        self.enable_warning, self.target = enable_warning, target
        self.shape_hints = dynamic.normalize_hints(shape_hints)
        self.applied: list[str] = []
        self.kept: list[str] = []
        self.predicted: list[str] = []
        self.unknown: list[str] = []
        self._predicted = None  # the work_dir's predicted schedules, while applying
        self._task_hashes: set[int] | None = None  # the work_dir's tasks, read when needed

    def _database(self) -> Database:
        if self.database is not None:
            return self.database
        if self.work_dir is not None:  # read only: applying never creates files
            return self.work_dir.open_for_apply()
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
        self.applied, self.kept, self.predicted, self.unknown = [], [], [], []
        self._task_hashes = None
        self._predicted = self.work_dir.open_predicted() \
            if self.work_dir is not None and self.database is None else None
        bounds = upper_bounds(mod)
        side: tuple[dict, dict] | None = None  # the work_dir's ranking and plan, read once
        static = 0  # static functions looked up
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
                static += 1
                new = self._apply_one(db, gv.name_hint, func, target)
            if new is not None:
                out.update_func(gv, new)
                self.applied.append(gv.name_hint)
        self._warn_if_foreign(db, static)
        return out

    def _warn_if_foreign(self, db: Database, static: int) -> None:
        """Warn when a quarter or more of the ``static`` functions looked up are
        ``unknown`` to a work_dir that holds records (tuned into it, there are none or one;
        a work_dir without records is an untuned compile the user chose)."""
        if self.work_dir is None or self.database is not None or not static \
                or 4 * len(self.unknown) < static or not self._holds_records(db):
            return
        logger.warning("%d of %d kernels are not in the work_dir %s (tuned for another model, "
                       "relax_tune version or target, or with op_names leaving them out): "
                       "they run untuned. Tune this model into it (e.g. max_time=60) or use a "
                       "fresh work_dir", len(self.unknown), static, self.work_dir.path)

    def _apply_dynamic(self, db: Database, name: str, func: tirx.PrimFunc, target,
                       bounds: dict[str, int], rankings: dict, plans: dict
                       ) -> tirx.PrimFunc | None:
        """The dispatching function of a symbolic ``func`` built from the records of its
        buckets (``relax_tune.dynamic.apply``), or None (no bucket has a record, or it
        cannot be built, or the untuned function won: then ``func`` is in ``kept``)."""
        new, kept = apply_dynamic(db, name, func, target, bounds, self.work_dir,
                                  self.shape_hints, rankings, plans, self.enable_warning)
        if new is None and not kept and self._predicted is not None:
            # no bucket measured: the buckets' predicted schedules (a measure=False
            # session, or buckets a time limit left unmeasured)
            new, kept = apply_dynamic(self._predicted, name, func, target, bounds,
                                      self.work_dir, self.shape_hints, rankings, plans,
                                      self.enable_warning)
            if new is not None:
                self.predicted.append(name)
        if kept:
            self.kept.append(name)
        return None if new is None else _with_attrs_of(new, func)

    def _predicted_schedule(self, name: str, func: tirx.PrimFunc, target):
        """The work_dir's predicted schedule of ``func`` (``database.predicted``: chosen by
        the cost model, not measured), for a function with no measured record; or None."""
        if self._predicted is None:
            return None
        try:
            sch = self._predicted.query_schedule(normalize_mod(func), target)
        except Exception as err:  # a bad record must not break the compilation
            logger.warning("%s: could not apply its predicted schedule (%s); keeping it as it "
                           "was", name, err)
            return None
        if sch is not None:
            self.predicted.append(name)
        return sch

    def _holds_records(self, db: Database) -> bool:
        try:
            return len(db) > 0 or (self._predicted is not None and len(self._predicted) > 0)
        except Exception:  # noqa: BLE001 - only a warning depends on it
            return False

    def _known(self, db: Database, func: tirx.PrimFunc) -> bool:
        """Whether ``func``'s workload is in ``db``, the work_dir's predicted store, or its
        tasks (a task the work_dir's sessions left untuned belongs to it all the same: a
        no-measurement compile leaves its layout and elementwise tasks as they are)."""
        mod = normalize_mod(func)
        try:
            if self._task_hashes is None:
                self._task_hashes = set(self.work_dir.read_task_meta()) \
                    if self.work_dir is not None else set()
            return db.has_workload(mod) or (self._predicted is not None
                                            and self._predicted.database.has_workload(mod)) \
                or structural_hash(mod) in self._task_hashes
        except Exception:  # noqa: BLE001 - only a warning depends on it
            return True

    def _apply_one(self, db: Database, name: str, func: tirx.PrimFunc,
                   target) -> tirx.PrimFunc | None:
        try:
            sch = db.query_schedule(normalize_mod(func), target)
        except Exception as err:  # a bad record must not break the compilation
            logger.warning("%s: could not apply its tuning record (%s); keeping it as it was",
                           name, err)
            return None
        if sch is None:
            sch = self._predicted_schedule(name, func, target)
        if sch is None:
            if not self._known(db, func):
                self.unknown.append(name)
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


def _with_attrs_of(new: tirx.PrimFunc, func: tirx.PrimFunc) -> tirx.PrimFunc:
    """A scheduled ``new`` carrying ``func``'s attributes (and no global symbol where it
    had none), marked ``tirx.is_scheduled``."""
    if func.attrs is not None:
        new = new.with_attrs(func.attrs)
    if func.attrs is None or "global_symbol" not in func.attrs:
        new = new.without_attr("global_symbol")
    return new.with_attr("tirx.is_scheduled", True)
