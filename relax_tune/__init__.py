"""relax_tune: a search-based auto-tuner for TVM Relax pipelines, shipped as IRModule passes.

    import relax_tune as rt
    seq = tvm.ir.transform.Sequential([
        relax.get_pipeline("zero"),
        rt.transform.TuneIRMod(params={}, work_dir=wd, max_trials_global=64),
        rt.transform.ApplyDatabase(work_dir=wd),
    ])
    with target:
        mod = seq(mod)

Importing the package registers the pipeline ``relax.get_pipeline("relax_tune", ...)``.
"""

from . import database, transform
from . import dynamic
from .database import (
    Database,
    JSONDatabase,
    MemoryDatabase,
    OrderedUnionDatabase,
    ScheduleFnDatabase,
    TuningRecord,
    UnionDatabase,
    Workload,
)
from .tuning.extract import ExtractedTask, Task, extract_tasks
from .model_loader import LoadedModel, load_model
from .transform import ApplyDatabase, ExtractTasks, TuneIRMod, TuneTIR, relax_tune_pipeline
from .report import TaskReport
from .tuning.tune import tune_relax, tune_tasks, tune_tir
from .config import TuneConfig
from .dynamic import parse_shape_hints
from .utils import RelaxTuneError, host_target

transform.register_pipeline()

__all__ = [
    "ApplyDatabase", "Database", "ExtractTasks", "ExtractedTask", "JSONDatabase",
    "LoadedModel", "MemoryDatabase", "OrderedUnionDatabase", "RelaxTuneError", "ScheduleFnDatabase",
    "Task", "TaskReport", "TuneConfig", "TuneIRMod", "TuneTIR", "TuningRecord", "UnionDatabase", "Workload",
    "database", "dynamic", "extract_tasks", "host_target", "load_model", "relax_tune_pipeline", "transform",
    "parse_shape_hints", "tune_relax", "tune_tasks", "tune_tir",
]
