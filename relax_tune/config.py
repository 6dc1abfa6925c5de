"""One tuning session's configuration: every option a user can pass, validated once.

Every entry point (``TuneIRMod``, ``TuneTIR``, the "relax_tune" pipeline, ``tune_tir``,
``tune_relax``, ``tune_tasks``, the command line) builds a :class:`TuneConfig` from the
options it is given, before any work starts. An unknown option (a misspelling) or a value
of the wrong type or range raises ``RelaxTuneError`` naming it and what is valid, so a
user's mistake never turns into a silently untuned model.
"""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass, fields, replace
from typing import Any

from .utils import RelaxTuneError


DEFAULT_TRIALS = 64
"""The trial budget of a session given neither ``max_trials_global`` nor ``max_time``."""
UNLIMITED_TRIALS = 10**9
"""The trial budget of a session given a ``max_time`` and no ``max_trials_global``."""


@dataclass(frozen=True)
class TuneConfig:
    """What one tuning session does (budgets, search, measurement, presentation).

    Attributes
    ----------
    max_trials_global: trials shared by all tasks (>= 0); None (the default): 64, or no
        trial limit when ``max_time`` is given (``trial_budget``).
    max_trials_per_task: cap per task (None: the global budget).
    num_trials_per_iter: candidates per batch (>= 1).
    max_time: wall-clock limit in seconds for the whole session, untuned baselines and
        searches included (None: none); the batch in flight finishes. With ``max_time``
        and no trial budget given, the time is the only limit. A limit is a positive,
        finite number: NaN, infinity, zero and negative seconds are refused (leave it out
        for no limit; ``measure=False`` times nothing).
    measure: False compiles without timing anything: each task that tiles for reuse gets
        the schedule the pre-trained model ranks first (``tuning.predict``; the
        no-measurement compile, seconds per model), the others keep their untuned code.
    transfer: the best schedules of alike workloads (the same computation on other
        shapes: in the work_dir's database and in the library shipped with the package)
        are refitted to each task; they lead its first batch, and without measurement the
        close ones are applied instead of the model's choice (``relax_tune.transfer``).
    op_names: keep only the tasks whose name contains one of these strings (None: all).
    strategy: search strategy name (``relax_tune.search.search_names()``).
    cost_model: "xgb-prior" (the default: the shipped pre-trained model, adapting to the
        session), "xgb" (XGBoost learning from the session only; "xgb-fresh" is the same),
        "random", "none", or a ``CostModel``.
    task_scheduler: "gradient", "round-robin", or a ``TaskScheduler``.
    convergence_window: a task stops when its best did not improve by 1% over this many
        trials (0: never).
    min_task_share: tasks estimated to cost less than this share of the tuned model are
        left at their baseline (see ``tune.tune_tasks``).
    seed: seed of every random choice of the session.
    measure_baseline: time each task's baseline once (its baseline record: the untuned
        function; on a GPU the target's default schedule, ``measure.baseline``).
    check_correctness: compare a would-be best with the task's baseline before it counts.
    head_to_head_rounds: rounds of alternating re-timing for close would-be bests (0: off).
    progress_bar: force the bar on a terminal on (True) or off (False); None: automatic.
    shape_hints: the sizes each symbolic shape variable is tuned at, ``{"n": [1, 16, 64]}``
        or ``{"n": {16: 2.0, 64: 1.0}}`` (size: weight), or the command line's
        ``"n=1,16,64"``; stored as ``{name: {size: weight}}``. None: 1 and the powers of 4
        up to the variable's upper bound (1024 without one). See ``relax_tune.dynamic``.
    dispatch_ranking: after the search, this many fastest records of each dynamic-shape
        bucket are timed again as ``ApplyDatabase`` runs them (replayed on the symbolic
        function) and the fastest there is the one applied (``relax_tune.dynamic.rank``;
        needs a work_dir). 0 (default): off, the fastest static record is applied. It costs
        a symbolic build per record (docs/design/dispatch-plan.md).
    dispatch_plan: after the search (and the ranking), each dynamic-shape function's
        buckets' kernels are timed at the hinted sizes and between them, and a size goes to
        the kernel clearly fastest there rather than to the nearest bucket
        (``relax_tune.dynamic.plan``; needs a work_dir). True (default): on; a symbolic
        build per bucket and a few runs per stretch.
    builder: a ``relax_tune.measure`` builder (None: a ``LocalBuilder`` per session).
    runner: a ``relax_tune.measure`` runner (None: a ``LocalRunner`` per session).
    """

    max_trials_global: int | None = None
    max_trials_per_task: int | None = None
    num_trials_per_iter: int = 16
    max_time: float | None = None
    measure: bool = True
    transfer: bool = True
    op_names: tuple[str, ...] | None = None
    strategy: str = "evolutionary"
    cost_model: Any = "xgb-prior"
    task_scheduler: Any = "gradient"
    convergence_window: int = 64
    min_task_share: float = 0.005
    seed: int = 1
    measure_baseline: bool = True
    check_correctness: bool = True
    head_to_head_rounds: int = 3
    progress_bar: bool | None = None
    shape_hints: Any = None
    dispatch_ranking: int = 0
    dispatch_plan: bool = True
    builder: Any = None
    runner: Any = None

    def __post_init__(self) -> None:
        if self.max_trials_global is not None:
            _check_int("max_trials_global", self.max_trials_global, minimum=0)
        if self.max_trials_per_task is not None:
            _check_int("max_trials_per_task", self.max_trials_per_task, minimum=0)
        _check_int("num_trials_per_iter", self.num_trials_per_iter, minimum=1)
        if self.max_time is not None:
            check_max_time(self.max_time)
        if self.op_names is not None:
            if isinstance(self.op_names, str) or not all(
                    isinstance(n, str) for n in self.op_names):
                raise RelaxTuneError(f"op_names must be a list of strings, not "
                                     f"{self.op_names!r}; e.g. op_names=['matmul', 'conv2d']")
            object.__setattr__(self, "op_names", tuple(self.op_names))
        _check_name("strategy", self.strategy, _search_names)
        if self.cost_model is not None and isinstance(self.cost_model, str):
            _check_name("cost_model", self.cost_model, _cost_model_names)
        if isinstance(self.task_scheduler, str):
            _check_name("task_scheduler", self.task_scheduler, _scheduler_names)
        _check_int("convergence_window", self.convergence_window, minimum=0)
        _check_number("min_task_share", self.min_task_share, minimum=0, maximum=1)
        _check_int("seed", self.seed, minimum=0)
        for name in ("measure", "transfer", "measure_baseline", "check_correctness", "dispatch_plan"):
            if not isinstance(getattr(self, name), bool):
                raise RelaxTuneError(f"{name} must be True or False, not "
                                     f"{getattr(self, name)!r}")
        if self.progress_bar is not None and not isinstance(self.progress_bar, bool):
            raise RelaxTuneError(f"progress_bar must be True, False or None, not "
                                 f"{self.progress_bar!r}")
        _check_int("head_to_head_rounds", self.head_to_head_rounds, minimum=0)
        _check_int("dispatch_ranking", self.dispatch_ranking, minimum=0)
        from .dynamic import normalize_hints

        object.__setattr__(self, "shape_hints", normalize_hints(self.shape_hints))
        _check_part("builder", self.builder, "Builder")
        _check_part("runner", self.runner, "Runner")

    @property
    def trial_budget(self) -> int:
        """Trials shared by all tasks: ``max_trials_global``; when it is not given,
        ``DEFAULT_TRIALS``, or ``UNLIMITED_TRIALS`` under a ``max_time`` (the time is then
        the budget)."""
        if self.max_trials_global is not None:
            return self.max_trials_global
        return DEFAULT_TRIALS if self.max_time is None else UNLIMITED_TRIALS

    @property
    def per_task_budget(self) -> int:
        """Trials one task may get: ``max_trials_per_task``, or the global budget."""
        return self.trial_budget if self.max_trials_per_task is None \
            else self.max_trials_per_task

    def with_options(self, **options: Any) -> TuneConfig:
        """A copy with ``options`` replaced (validated like the constructor's)."""
        return make_config(self, **options)


OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(TuneConfig))
"""Every option a tuning entry point accepts."""


def make_config(config: TuneConfig | None = None, **options: Any) -> TuneConfig:
    """``config`` (default: the defaults) with ``options`` replaced; an unknown option name
    raises RelaxTuneError naming it, the closest valid name and all valid names."""
    if config is not None and not isinstance(config, TuneConfig):
        raise RelaxTuneError(f"config must be a relax_tune.TuneConfig, not "
                             f"{type(config).__name__}")
    unknown = [name for name in options if name not in OPTION_NAMES]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, OPTION_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise RelaxTuneError(f"unknown tuning option {name!r}{hint}; valid options: "
                             f"{', '.join(OPTION_NAMES)}")
    return replace(config or TuneConfig(), **options) if options else (config or TuneConfig())


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RelaxTuneError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise RelaxTuneError(f"{name} must be >= {minimum}, not {value}")


def check_max_time(value: Any, name: str = "max_time") -> None:
    """Refuse a time limit that is not a positive, finite number of seconds (NaN compares
    false with every bound, so it would be no limit at all; infinity and <= 0 are no limit
    or no tuning), naming ``name`` and what to give instead."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RelaxTuneError(f"{name} must be a number of seconds, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise RelaxTuneError(f"{name} must be a positive, finite number of seconds, not "
                             f"{value}: leave it out for no time limit (measure=False / "
                             "relax-tune compile --predict times nothing)")


def _check_number(name: str, value: Any, minimum: float, maximum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RelaxTuneError(f"{name} must be a number, not {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise RelaxTuneError(f"{name} must be {bound}, not {value}")


def _check_name(name: str, value: Any, known) -> None:
    names = known()
    if not isinstance(value, str) or value not in names:
        raise RelaxTuneError(f"{name}={value!r} is not one of {', '.join(sorted(names))}")


def _check_part(name: str, value: Any, base: str) -> None:
    from . import measure

    if value is not None and not isinstance(value, getattr(measure, base)):
        raise RelaxTuneError(f"{name}={value!r} is not a relax_tune.measure.{base} (e.g. "
                             f"Local{base}(), or a subclass of {base})")


def _search_names() -> list[str]:
    from .search import search_names

    return list(search_names())


def _cost_model_names() -> list[str]:
    from .cost_model import cost_model_names

    return list(cost_model_names())


def _scheduler_names() -> list[str]:
    from .tuning.scheduler import scheduler_names

    return list(scheduler_names())
