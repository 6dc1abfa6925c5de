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

from . import database, dynamic, pipeline, transform
from .config import TuneConfig
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
from .dynamic import parse_shape_hints
from .model_loader import LoadedModel, load_model
from .pipeline import relax_tune_pipeline
from .transform import ApplyDatabase, ExtractTasks, TuneIRMod, TuneTIR
from .tuning import ExtractedTask, Task, TaskReport, extract_tasks, tune_relax, tune_tasks, tune_tir
from .utils import RelaxTuneError, host_target
from .work_dir import WorkDir

pipeline.register_pipeline()

__all__ = [
    "ApplyDatabase", "Database", "ExtractTasks", "ExtractedTask", "JSONDatabase",
    "LoadedModel", "MemoryDatabase", "OrderedUnionDatabase", "RelaxTuneError",
    "ScheduleFnDatabase", "Task", "TaskReport", "TuneConfig", "TuneIRMod", "TuneTIR",
    "TuningRecord", "UnionDatabase", "WorkDir", "Workload", "database", "dynamic",
    "extract_tasks", "host_target", "load_model", "parse_shape_hints", "pipeline",
    "relax_tune_pipeline", "transform", "tune_relax", "tune_tasks", "tune_tir",
]
