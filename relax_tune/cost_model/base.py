"""The cost-model protocol, the random model, and the registry that turns names into models."""

from __future__ import annotations

import logging
from typing import Callable, Sequence

import numpy as np
from tvm.s_tir import Schedule

from ..utils import RelaxTuneError
from ..work_dir import WorkDir
from .features import extract_features_batch

logger = logging.getLogger("relax_tune.cost_model")


class CostModel:
    """Predicts how good unmeasured candidates are, learning from measured ones.

    Scores are "higher is better" and only comparable within one task. Subclasses implement
    ``predict_features`` / ``update_features`` on feature matrices (see
    ``features.extract_features``); ``predict`` / ``update`` take schedules and extract the
    features first. ``save`` / ``load`` keep the model in a directory (warm start).
    """

    name = "base"

    def predict(self, task: str, programs: Sequence[Schedule]) -> np.ndarray:
        """One score per program of ``task`` (higher: predicted faster)."""
        return self.predict_features(task, extract_features_batch(list(programs)))

    def update(self, task: str, programs: Sequence[Schedule], run_secs: Sequence[float],
               keys: Sequence[str] | None = None) -> None:
        """Learn from measured programs of ``task`` (mean seconds; failures as 1e10);
        ``keys`` (candidate keys) let the model skip results it has already seen."""
        self.update_features(task, extract_features_batch(list(programs)), run_secs, keys)

    def predict_features(self, task: str, features: np.ndarray) -> np.ndarray:
        """Scores for a feature matrix (one row per program)."""
        raise NotImplementedError

    def update_features(self, task: str, features: np.ndarray, run_secs: Sequence[float],
                        keys: Sequence[str] | None = None) -> None:
        """Learn from a feature matrix and the measured mean seconds of its rows."""
        return None

    def set_target(self, task: str, target) -> None:
        """The target ``task``'s candidates are for (models that use machine facts read it;
        called by the search before the first ``predict``)."""
        return None

    def save(self, path: str) -> None:
        """Write the model into directory ``path`` (nothing for stateless models)."""
        return None

    def load(self, path: str) -> bool:
        """Read a model saved in directory ``path``; False when there is none to read."""
        return False

    @property
    def trained(self) -> bool:
        """Whether predictions carry information (False: they are random)."""
        return False

    def ranks(self, task: str) -> bool:
        """Whether the model's predictions for ``task``'s candidates carry information (the
        search then screens a larger first pool with it); by default, ``trained``."""
        return self.trained


class RandomModel(CostModel):
    """Random scores: the baseline every learned model must beat (and what "random" names).

    Args:
        seed: seed of the scores.
    """

    name = "random"

    def __init__(self, seed: int = 1) -> None:
        self.rng = np.random.default_rng(seed)

    def predict_features(self, task: str, features: np.ndarray) -> np.ndarray:
        """Uniform random scores in [0, 1)."""
        return self.rng.random(len(features))


CostModelFactory = Callable[..., CostModel]
_MODELS: dict[str, CostModelFactory] = {"random": RandomModel}


def register_cost_model(name: str, factory: CostModelFactory) -> None:
    """Make ``make_cost_model(name, work_dir)`` call ``factory()`` (then ``load`` from
    work_dir when it holds a saved model)."""
    _MODELS[name] = factory


def cost_model_names() -> list[str]:
    """Names ``make_cost_model`` accepts ("none" included)."""
    return sorted(list(_MODELS) + ["none"])


def make_cost_model(name: "str | CostModel | None", work_dir: "WorkDir | str | None" = None
                    ) -> CostModel | None:
    """The cost model named ``name`` ("xgb-prior": the pre-trained model adapting to the
    session, the configuration's default; "xgb" or "xgb-fresh": XGBoost learning from the
    session only; "random"; or "none" -> None); a CostModel
    object passes through. With ``work_dir``, a model saved there by an earlier run is
    loaded (warm start)."""
    if name is None or isinstance(name, CostModel):
        return name
    if not isinstance(name, str):
        raise RelaxTuneError(f"cost_model={name!r} is neither a name nor a CostModel: use one "
                             f"of {cost_model_names()}")
    if name == "none":
        return None
    factory = _MODELS.get(name)
    if factory is None:
        raise RelaxTuneError(f"unknown cost model {name!r}: use one of {cost_model_names()}")
    model = factory()
    if work_dir is not None:
        path = WorkDir.of(work_dir).cost_model_dir
        try:
            if model.load(path):
                logger.info("cost model %s: warm start from %s", name, path)
        except Exception as err:  # a stale or damaged model file must not stop tuning
            logger.warning("cost model in %s not loaded (%s); starting fresh", path, err)
    return model
