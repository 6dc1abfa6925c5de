"""XGBoost cost model: learns normalised throughput from measured candidates of every task."""

from __future__ import annotations

import json
import logging
import os
from typing import Sequence

import numpy as np

from ..utils import FAILED_RUN_SECS
from .base import CostModel, register_cost_model
from .features import FEATURE_VERSION, N_FEATURES

logger = logging.getLogger("relax_tune.cost_model")

_MODEL_FILE = "xgb_model.json"
_DATA_FILE = "xgb_data.npz"
_META_FILE = "xgb_meta.json"


class XGBModel(CostModel):
    """Gradient-boosted trees over ``features.extract_features`` vectors.

    Training data are all measured candidates of the session, across tasks. A task's labels
    are its normalised throughputs, ``best_secs / secs`` (1 for its best candidate, 0 for a
    failure), so tasks of very different sizes share one model. The objective is squared
    error on those labels (``"reg"``, default; it ranked held-out candidates better than
    pairwise ranking in our measurements) or pairwise ranking within each task (``"rank"``). The trees are retrained from scratch after every update (a few hundred rows:
    tens of milliseconds). Until ``min_train_rows`` results with two distinct labels exist,
    predictions are random.

    Args:
        objective: "reg" (squared error) or "rank" (``rank:pairwise``, a group per task).
        num_boost_round: boosting rounds per training.
        max_depth: depth of each tree.
        eta: learning rate.
        min_train_rows: measured results needed before the model is trained.
        nthread: xgboost threads (1: leave the cores to the builder and runner).
        seed: seed of xgboost and of the random scores before training.
    """

    name = "xgb"

    def __init__(self, objective: str = "reg", num_boost_round: int = 80, max_depth: int = 4,
                 eta: float = 0.2, min_train_rows: int = 8, nthread: int = 1,
                 seed: int = 1) -> None:
        if objective not in ("rank", "reg"):
            raise ValueError(f"objective must be 'rank' or 'reg', not {objective!r}")
        self.objective = objective
        self.num_boost_round = num_boost_round
        self.max_depth = max_depth
        self.eta = eta
        self.min_train_rows = min_train_rows
        self.nthread = nthread
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self._x: dict[str, list[np.ndarray]] = {}
        self._secs: dict[str, list[float]] = {}
        self._keys: dict[str, set[str]] = {}
        self.booster = None

    # -- data ----------------------------------------------------------------------------

    @property
    def trained(self) -> bool:
        """Whether a booster has been trained (predictions are random otherwise)."""
        return self.booster is not None

    @property
    def num_rows(self) -> int:
        """Measured results the model holds, over all tasks."""
        return sum(len(v) for v in self._secs.values())

    def update_features(self, task: str, features: np.ndarray, run_secs: Sequence[float],
                        keys: Sequence[str] | None = None) -> None:
        """Add measured results of ``task`` (rows already seen by key are skipped) and
        retrain."""
        features = np.asarray(features, dtype=np.float32).reshape(-1, N_FEATURES)
        xs, secs = self._x.setdefault(task, []), self._secs.setdefault(task, [])
        seen = self._keys.setdefault(task, set())
        added = 0
        for i, (row, sec) in enumerate(zip(features, run_secs)):
            key = keys[i] if keys is not None else None
            if key is not None:
                if key in seen:
                    continue
                seen.add(key)
            xs.append(row)
            secs.append(float(sec))
            added += 1
        if added:
            self.train()

    def _labels(self, secs: list[float]) -> np.ndarray:
        arr = np.asarray(secs, dtype=np.float64)
        ok = arr < FAILED_RUN_SECS * 0.5
        if not ok.any():
            return np.zeros(len(arr))
        best = arr[ok].min()
        return np.where(ok, best / np.maximum(arr, 1e-12), 0.0)

    def training_set(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(X, y, group_sizes)``: rows grouped by task, labels normalised per task."""
        xs, ys, groups = [], [], []
        for task in sorted(self._x):
            if not self._x[task]:
                continue
            xs.append(np.stack(self._x[task]))
            ys.append(self._labels(self._secs[task]))
            groups.append(len(self._x[task]))
        if not xs:
            return np.zeros((0, N_FEATURES), np.float32), np.zeros(0), np.zeros(0, int)
        return np.concatenate(xs), np.concatenate(ys), np.asarray(groups)

    # -- training and prediction ----------------------------------------------------------

    def train(self) -> None:
        """Retrain the trees on everything measured so far (no-op below ``min_train_rows``)."""
        import xgboost as xgb

        x, y, groups = self.training_set()
        if len(y) < self.min_train_rows or len(np.unique(y)) < 2:
            return
        params = {"max_depth": self.max_depth, "eta": self.eta, "nthread": self.nthread,
                  "seed": self.seed, "min_child_weight": 1.0, "verbosity": 0,
                  "tree_method": "hist"}
        dtrain = xgb.DMatrix(x, label=y)
        if self.objective == "rank":
            params.update({"objective": "rank:pairwise", "lambdarank_pair_method": "topk",
                           "lambdarank_num_pair_per_sample": 8})
            dtrain.set_group(groups)
        else:
            params["objective"] = "reg:squarederror"
        self.booster = xgb.train(params, dtrain, num_boost_round=self.num_boost_round)

    def predict_features(self, task: str, features: np.ndarray) -> np.ndarray:
        """Predicted scores (higher: faster); random before the model is trained."""
        features = np.asarray(features, dtype=np.float32).reshape(-1, N_FEATURES)
        if self.booster is None or len(features) == 0:
            return self.rng.random(len(features))
        import xgboost as xgb

        return np.asarray(self.booster.predict(xgb.DMatrix(features)), dtype=np.float64)

    # -- persistence ----------------------------------------------------------------------

    def save(self, path: str) -> None:
        """Write the trees, the training data and their metadata into directory ``path``."""
        os.makedirs(path, exist_ok=True)
        tasks = sorted(t for t in self._x if self._x[t])
        x, _, _ = self.training_set()
        secs = np.concatenate([np.asarray(self._secs[t]) for t in tasks]) if tasks else np.zeros(0)
        task_idx = np.concatenate([np.full(len(self._x[t]), i) for i, t in enumerate(tasks)]) \
            if tasks else np.zeros(0, int)
        tmp = os.path.join(path, _DATA_FILE + ".tmp.npz")
        np.savez(tmp, x=x, secs=secs, task=task_idx)
        os.replace(tmp, os.path.join(path, _DATA_FILE))
        meta = {"feature_version": FEATURE_VERSION, "n_features": N_FEATURES, "tasks": tasks,
                "keys": {t: sorted(self._keys.get(t, ())) for t in tasks},
                "objective": self.objective}
        with open(os.path.join(path, _META_FILE + ".tmp"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        os.replace(os.path.join(path, _META_FILE + ".tmp"), os.path.join(path, _META_FILE))
        model_path = os.path.join(path, _MODEL_FILE)
        if self.booster is not None:
            self.booster.save_model(model_path)
        elif os.path.exists(model_path):
            os.remove(model_path)

    def load(self, path: str) -> bool:
        """Read what ``save`` wrote; False when ``path`` holds no model, or one made with
        other features (then this model stays as it was)."""
        meta_path = os.path.join(path, _META_FILE)
        if not os.path.exists(meta_path):
            return False
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("feature_version") != FEATURE_VERSION or meta.get("n_features") != N_FEATURES:
            logger.info("saved cost model in %s uses other features; not loaded", path)
            return False
        data = np.load(os.path.join(path, _DATA_FILE))
        tasks = list(meta["tasks"])
        self._x, self._secs, self._keys = {}, {}, {}
        for i, task in enumerate(tasks):
            sel = data["task"] == i
            self._x[task] = list(data["x"][sel].astype(np.float32))
            self._secs[task] = [float(s) for s in data["secs"][sel]]
            self._keys[task] = set(meta.get("keys", {}).get(task, []))
        model_path = os.path.join(path, _MODEL_FILE)
        self.booster = None
        if os.path.exists(model_path):
            import xgboost as xgb

            self.booster = xgb.Booster()
            self.booster.load_model(model_path)
        elif self.num_rows:
            self.train()
        return True


register_cost_model("xgb", XGBModel)
