"""The pre-trained cost model: ranks a new task's candidates before its first measurement.

``PriorXGBModel`` (``cost_model="xgb-prior"``, the default) starts from an XGBoost ranking model
trained on a corpus of measured candidates of many workloads (``tools/prior/make_corpus.py``,
``tools/prior/train_prior.py``) and shipped in the package (``pretrained/``). It scores
candidates on ``transfer.transfer_features``: the raw program features, the same centred on
the task, and what the target says about the machine. A target whose vector width has a
variant of its own (``pretrained/vector-32-bytes/``: AVX2 CPUs) is ranked by that one: the
shipped trees continued on the measurements of such CPUs, which on them rank better than the
general model and than a model trained on their measurements alone, while the general model
stays as it was for the others (docs/design/pretrained-prior.md).

During tuning it adapts to the session's measurements (``adapt``):

- ``"blend"``: a fresh ``XGBModel`` learns the session as ``cost_model="xgb-fresh"`` does;
  the score is a weighted sum of the two models' within-call ranks. The weight follows how
  well each model predicted the batches measured so far *before* it learnt them (Kendall tau
  per batch, a prequential test), so the fresh model takes over only where it ranks better.
- ``"finetune"``: boosting continues from the pre-trained trees on the session's
  measurements (``finetune_rounds`` more trees, a group per task), retrained after every
  update.
- ``"none"``: the pre-trained model alone.

``tools/prior/evaluate_prior.py`` measures which adaptation ranks held-out workloads best.
Without the shipped file (a damaged install) the model logs a warning and behaves as the
fresh model. The session's data are saved and loaded in ``XGBModel``'s format (the
pre-trained part is never written to a work_dir), so a work_dir warm-starts either model.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from importlib import resources
from typing import Sequence

import numpy as np

from ..utils import FAILED_RUN_SECS
from .base import CostModel, register_cost_model
from .features import FEATURE_VERSION, N_FEATURES
from .transfer import TRANSFER_VERSION, N_TRANSFER, target_facts, task_reference, \
    transfer_features
from .xgb import XGBModel

logger = logging.getLogger("relax_tune.cost_model")

PRIOR_MODEL_FILE = "xgb_prior.ubj"
PRIOR_META_FILE = "xgb_prior_meta.json"
VARIANT_DIR = "vector-{}-bytes"
"""Sub-folder of a pre-trained model's directory with the booster for targets whose vectors
are that many bytes (``train_prior.py --vector-bytes``); other targets get the directory's own."""
ADAPT_MODES = ("blend", "finetune", "none")
_MIN_REFERENCE_ROWS = 8


def prior_files(directory: str | None = None) -> tuple[str, str]:
    """Paths of a pre-trained model and its metadata in ``directory`` (a
    ``train_prior.py --out`` directory; default: the shipped one, package data
    ``pretrained/``)."""
    if directory is not None:
        return os.path.join(directory, PRIOR_MODEL_FILE), os.path.join(directory, PRIOR_META_FILE)
    base = resources.files("relax_tune.cost_model") / "pretrained"
    return str(base / PRIOR_MODEL_FILE), str(base / PRIOR_META_FILE)


def prior_variants(directory: str) -> dict[int, tuple[str, str]]:
    """``{vector bytes: (model path, meta path)}`` of the variants in a pre-trained model's
    ``directory`` (``VARIANT_DIR`` sub-folders holding both files)."""
    out = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return out
    for name in names:
        match = re.fullmatch(VARIANT_DIR.format(r"(\d+)"), name)
        files = prior_files(os.path.join(directory, name))
        if match and all(os.path.isfile(f) for f in files):
            out[int(match.group(1))] = files
    return out


def load_prior(model_path: str | None = None, meta_path: str | None = None):
    """``(booster, meta)`` of the pre-trained model (the shipped one by default); raises
    FileNotFoundError when it is missing and ValueError when it was made for other
    features."""
    import xgboost as xgb

    default_model, default_meta = prior_files()
    model_path, meta_path = model_path or default_model, meta_path or default_meta
    with open(meta_path, encoding="utf-8") as f:
        meta = json.load(f)
    if (meta.get("feature_version"), meta.get("transfer_version"), meta.get("n_columns")) != \
            (FEATURE_VERSION, TRANSFER_VERSION, N_TRANSFER):
        raise ValueError(f"pre-trained model {model_path} was made for other features "
                         f"(feature/transfer version {meta.get('feature_version')}/"
                         f"{meta.get('transfer_version')}, this is {FEATURE_VERSION}/"
                         f"{TRANSFER_VERSION}); retrain it with python -m tools.prior.train_prior")
    booster = xgb.Booster()
    booster.load_model(model_path)
    booster.set_param({"nthread": 1})
    return booster, meta


def within_ranks(scores: np.ndarray) -> np.ndarray:
    """Scores turned into their ranks scaled to [0, 1] (ties share a rank)."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(scores) <= 1:
        return np.ones(len(scores))
    order = np.argsort(np.argsort(scores, kind="stable"), kind="stable").astype(np.float64)
    return order / (len(scores) - 1)


def kendall_tau(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-a between two score vectors (pairs tied in either count as 0)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    n = len(a)
    if n < 2:
        return 0.0
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    return float((da * db).sum() / (n * (n - 1)))


class PriorXGBModel(CostModel):
    """The shipped pre-trained ranking model, adapting to the session (module docstring).

    Args:
        adapt: "blend" (default), "finetune" or "none".
        finetune_rounds: trees added to the pre-trained ones when fine-tuning.
        blend_temperature: how sharply the blend weight follows the tau difference.
        model_path, meta_path: another pre-trained model (default: the shipped one).
        seed, nthread, **fresh_options: of the fresh ``XGBModel`` (and of fine-tuning).
    """

    name = "xgb"

    def __init__(self, adapt: str = "blend", finetune_rounds: int = 30,
                 blend_temperature: float = 8.0, model_path: str | None = None,
                 meta_path: str | None = None, seed: int = 1, nthread: int = 1,
                 **fresh_options) -> None:
        if adapt not in ADAPT_MODES:
            raise ValueError(f"adapt must be one of {ADAPT_MODES}, not {adapt!r}")
        self.adapt = adapt
        self.finetune_rounds = finetune_rounds
        self.blend_temperature = blend_temperature
        self.seed = seed
        self.nthread = nthread
        self.fresh = XGBModel(seed=seed, nthread=nthread, **fresh_options)
        self.rng = np.random.default_rng(seed)
        try:
            self.prior, self.meta = load_prior(model_path, meta_path)
        except (OSError, ValueError) as err:
            logger.warning("pre-trained cost model not loaded (%s); learning from scratch", err)
            self.prior, self.meta = None, {}
        directory = os.path.dirname(model_path or prior_files()[0])
        self._variant_files = prior_variants(directory) if self.prior is not None else {}
        self._bases: dict[int, object] = {}  # vector bytes -> booster, read when first asked
        self.tuned = None  # the fine-tuned booster
        self._facts: dict[str, dict] = {}
        self._other_kind: set[str] = set()  # tasks for targets the prior was not trained on
        self._kinds = _trained_kinds(self.meta)
        self._refs: dict[str, np.ndarray] = {}
        self._host_facts: dict | None = None
        self._taus: dict[str, list[float]] = {"prior": [], "fresh": []}

    # -- the task's context ---------------------------------------------------------------

    def set_target(self, task: str, target) -> None:
        """The target ``task``'s candidates are for (its machine facts; default: the host).
        A task for a kind of target the prior never saw (a GPU: it was trained on CPUs) is
        ranked by the fresh model alone."""
        kind = getattr(getattr(target, "kind", None), "name", None)
        if self.prior is not None and kind is not None and kind not in self._kinds:
            self._other_kind.add(task)
        try:
            self._facts[task] = target_facts(target)
        except Exception as err:  # an odd target: host facts
            logger.debug("target facts of %s not read: %s", target, err)

    def trained_kinds(self) -> set[str]:
        """Target kinds ("llvm", ...) of the corpus the prior was trained on."""
        return set(self._kinds)

    def uses_prior(self, task: str) -> bool:
        """Whether the pre-trained model ranks ``task``'s candidates."""
        return self.prior is not None and task not in self._other_kind

    def set_facts(self, task: str, facts: dict) -> None:
        """Machine facts of ``task``'s target given directly (``transfer.FACT_NAMES``)."""
        self._facts[task] = dict(facts)

    def facts(self, task: str) -> dict:
        """Machine facts of ``task``'s target."""
        if task in self._facts:
            return self._facts[task]
        if self._host_facts is None:
            from ..utils import host_target

            self._host_facts = target_facts(host_target())
        return self._host_facts

    def base(self, task: str):
        """The pre-trained booster that ranks ``task``: the variant for its target's vector
        width (``VARIANT_DIR``) where the model has one, else the model's own."""
        width = int(self.facts(task).get("vector_bytes", 0) or 0)
        if width not in self._bases:
            self._bases[width] = self.prior
            files = self._variant_files.get(width)
            if files is not None:
                try:
                    self._bases[width] = load_prior(*files)[0]
                except (OSError, ValueError) as err:
                    logger.warning("pre-trained model for %d-byte vectors not loaded (%s); the "
                                   "general one ranks", width, err)
        return self._bases[width]

    def _reference(self, task: str, raw: np.ndarray) -> np.ndarray:
        ref = self._refs.get(task)
        if ref is not None:
            return ref
        ref = task_reference(raw)
        if len(raw) >= _MIN_REFERENCE_ROWS:  # kept: the task's later calls share it
            self._refs[task] = ref
        return ref

    def transfer(self, task: str, raw: np.ndarray) -> np.ndarray:
        """``transfer_features`` of ``raw`` rows of ``task``."""
        raw = np.asarray(raw, dtype=np.float32).reshape(-1, N_FEATURES)
        return transfer_features(raw, self._reference(task, raw), self.facts(task))

    # -- CostModel ------------------------------------------------------------------------

    @property
    def trained(self) -> bool:
        """True when the pre-trained model is loaded (or the session trained the fresh one)."""
        return self.prior is not None or self.fresh.trained

    def ranks(self, task: str) -> bool:
        """True when the pre-trained model ranks ``task`` or the session trained the fresh
        one."""
        return self.uses_prior(task) or self.fresh.trained

    @property
    def num_rows(self) -> int:
        """Measured results of the session the model holds."""
        return self.fresh.num_rows

    def _prior_scores(self, task: str, raw: np.ndarray) -> np.ndarray:
        import xgboost as xgb

        booster = self.tuned if self.tuned is not None else self.base(task)
        return np.asarray(booster.predict(xgb.DMatrix(self.transfer(task, raw))), np.float64)

    def blend_weight(self) -> float:
        """The pre-trained model's weight in "blend" (1 until the fresh one is trained)."""
        if not self.fresh.trained:
            return 1.0
        tp, tf = self._taus["prior"], self._taus["fresh"]
        if not tf:
            return 1.0
        diff = float(np.mean(tp[-8:]) - np.mean(tf[-8:]))
        return 1.0 / (1.0 + math.exp(-self.blend_temperature * diff))

    def predict_features(self, task: str, features: np.ndarray) -> np.ndarray:
        """Scores (higher: predicted faster), comparable within one call."""
        raw = np.asarray(features, dtype=np.float32).reshape(-1, N_FEATURES)
        if len(raw) == 0:
            return np.zeros(0)
        if not self.uses_prior(task):
            return self.fresh.predict_features(task, raw)
        prior = self._prior_scores(task, raw)
        if self.adapt != "blend" or not self.fresh.trained:
            return prior
        w = self.blend_weight()
        fresh = self.fresh.predict_features(task, raw)
        return w * within_ranks(prior) + (1.0 - w) * within_ranks(fresh)

    def update_features(self, task: str, features: np.ndarray, run_secs: Sequence[float],
                        keys: Sequence[str] | None = None) -> None:
        """Learn measured results of ``task``: score them first with both models (the blend
        weight's evidence), then train the fresh model (and the fine-tuned trees)."""
        raw = np.asarray(features, dtype=np.float32).reshape(-1, N_FEATURES)
        secs = np.asarray(run_secs, dtype=np.float64)
        if keys is not None:  # only rows the model has not seen are evidence
            seen = self.fresh._keys.get(task, set())
            new = np.asarray([k not in seen for k in keys], dtype=bool)
        else:
            new = np.ones(len(raw), dtype=bool)
        ok = new & (secs < FAILED_RUN_SECS * 0.5)
        if self.uses_prior(task) and self.adapt == "blend" and self.fresh.trained \
                and ok.sum() >= 4:
            target = -secs[ok]
            self._taus["prior"].append(kendall_tau(self._prior_scores(task, raw[ok]), target))
            self._taus["fresh"].append(
                kendall_tau(self.fresh.predict_features(task, raw[ok]), target))
        before = self.fresh.num_rows
        self.fresh.update_features(task, raw, run_secs, keys)
        if self.prior is not None and self.adapt == "finetune" and self.fresh.num_rows > before:
            self._finetune()

    def _finetune(self) -> None:
        import xgboost as xgb

        xs, ys, groups, base = [], [], [], None
        for task in sorted(self.fresh._x):
            rows = self.fresh._x[task]
            if len(rows) < 2 or not self.uses_prior(task):
                continue
            raw = np.stack(rows)
            if base is None:  # a session's tasks share one target
                base = self.base(task)
            xs.append(self.transfer(task, raw))
            ys.append(self.fresh._labels(self.fresh._secs[task]))
            groups.append(len(rows))
        if not xs or sum(groups) < self.fresh.min_train_rows:
            return
        y = np.concatenate(ys)
        if len(np.unique(y)) < 2:
            return
        dtrain = xgb.DMatrix(np.concatenate(xs), label=y)
        dtrain.set_group(groups)
        params = dict(self.meta.get("params", {}))
        params.update({"nthread": self.nthread, "seed": self.seed, "verbosity": 0})
        self.tuned = xgb.train(params, dtrain, num_boost_round=self.finetune_rounds,
                               xgb_model=base.copy())

    # -- persistence: the session's data, in XGBModel's format ------------------------------

    def save(self, path: str) -> None:
        """Write the session's measurements (and the fresh model) into ``path``."""
        self.fresh.save(path)

    def load(self, path: str) -> bool:
        """Read what ``save`` (or ``XGBModel.save``) wrote; the pre-trained part is the
        package's own."""
        loaded = self.fresh.load(path)
        if loaded and self.prior is not None and self.adapt == "finetune" and self.fresh.num_rows:
            self._finetune()
        return loaded


def _trained_kinds(meta: dict) -> set[str]:
    """Target kinds in a pre-trained model's metadata (its corpus's targets; "llvm" when it
    does not say)."""
    kinds = set()
    for text in meta.get("targets", []):
        try:
            kinds.add(json.loads(text)["kind"])
        except (ValueError, KeyError, TypeError):  # a plain target string
            kinds.add(str(text).split()[0])
    return kinds or {"llvm"}


def _fresh() -> XGBModel:
    return XGBModel()


# "xgb-prior" is TuneConfig's default; "xgb" (and "xgb-fresh") stay the session-only XGBModel
register_cost_model("xgb-prior", PriorXGBModel)
register_cost_model("xgb-fresh", _fresh)
