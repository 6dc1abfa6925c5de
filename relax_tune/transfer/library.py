"""The library of tuned schedules shipped with the package, as AutoTVM's TopHub was.

``relax_tune/transfer/library/`` holds a database (the two JSON files of a work_dir) with
the best record of each workload of some models tuned on some machines
(``tools/transfer_library/build_library.py`` makes it; the files say which models, the
records which target). A task finds there the schedules of alike workloads
(``source.TransferSource``); a record tuned for a machine of another class still seeds the
search, and is applied unmeasured only on its own class.
"""

from __future__ import annotations

import functools
import logging
import os

from ..database import Database, JSONDatabase

logger = logging.getLogger(__name__)

LIBRARY_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "library")


@functools.lru_cache(maxsize=1)
def library_database() -> Database | None:
    """The shipped library, read once per process (None when the package has none or it
    cannot be read: tuning goes on without it)."""
    workloads = os.path.join(LIBRARY_DIR, "database_workload.json")
    if not os.path.isfile(workloads):
        return None
    try:
        return JSONDatabase(workloads, os.path.join(LIBRARY_DIR, "database_tuning_record.json"),
                            allow_missing=False)
    except Exception as err:  # noqa: BLE001 - a bonus, never a failure
        logger.warning("the shipped schedule library is unreadable (%s): tuning goes on "
                       "without it", err)
        return None
