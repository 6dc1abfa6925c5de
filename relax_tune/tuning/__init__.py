"""The tuning session: tasks extracted from a module, the loop that spends the budget on
them (scheduler, search, measurement, database), the per-task state it keeps and the
progress it shows.

``tune_tasks`` assembles the parts and runs the loop; ``tune_tir`` / ``tune_relax`` extract
the tasks first.
"""

from .extract import ExtractedTask, Task, extract_tasks
from .state import TaskReport
from .tune import tune_relax, tune_tasks, tune_tir

__all__ = ["ExtractedTask", "Task", "TaskReport", "extract_tasks", "tune_relax", "tune_tasks",
           "tune_tir"]
