"""Cost models: our own program features and the models that rank candidates with them.

    model = make_cost_model("xgb-prior", work_dir)  # pre-trained, adapting (the default);
                                                    # or "xgb" (session only), "random", "none"
    scores = model.predict(task_name, [cand.sch for cand in candidates])
    model.update(task_name, [c.sch for c in measured], run_secs, keys=[c.key ...])
    model.save(WorkDir.of(work_dir).cost_model_dir)
"""

from .base import (CostModel, RandomModel, cost_model_names, make_cost_model,
                   register_cost_model)
from .features import (FEATURE_VERSION, N_FEATURES, extract_features, extract_features_batch,
                       feature_names)
from .xgb import XGBModel
from .prior import PriorXGBModel  # registers "xgb-prior" (and "xgb-fresh", = "xgb")
from .transfer import target_facts, transfer_features

__all__ = [
    "CostModel", "FEATURE_VERSION", "N_FEATURES", "PriorXGBModel", "RandomModel", "XGBModel",
    "cost_model_names", "extract_features", "extract_features_batch", "feature_names",
    "make_cost_model", "register_cost_model", "target_facts", "transfer_features",
]
