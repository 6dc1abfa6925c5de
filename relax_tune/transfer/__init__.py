"""Schedules transferred from alike workloads: the same computation on other shapes.

A task's search starts from the best schedules of the workloads most like it, in the
session's database and in a library shipped with the package (``library.py``), their tile
sizes refitted to the task's shapes (``refit.py``); ``similarity.py`` says which workloads
are alike and how close, ``source.py`` finds and refits them. Design and measurements:
docs/design/transfer.md.
"""

from .library import LIBRARY_DIR, library_database
from .refit import fit_tile, refit_trace
from .similarity import Shape, shape_distance, workload_shape
from .source import TransferSource, Transferred, machine_class

__all__ = ["LIBRARY_DIR", "Shape", "TransferSource", "Transferred", "fit_tile",
           "library_database", "machine_class", "refit_trace", "shape_distance",
           "workload_shape"]
