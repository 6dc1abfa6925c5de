"""JSONDatabase: MetaSchedule's on-disk layout, read tolerantly and written append-only.

Two files, one JSON value a line (``tvm.s_tir.meta_schedule.database.JSONDatabase`` reads ours
and we read theirs):

- ``database_workload.json``: ``[str(shash), base64(8-byte LE length + save_json(mod))]``;
  line *i* (from 0) is workload index *i*;
- ``database_tuning_record.json``: ``[workload_index, [trace, run_secs, target, args_info]]``.

Unlike MetaSchedule, ``work_dir`` is created when missing, a corrupt or truncated line is skipped
with a warning naming the file and line while the rest loads, and files whose last line lacks its
newline get one before the next append (so a new line never fuses with a torn one). Loading
never rewrites a file; commits only append.
"""

from __future__ import annotations

import json
import logging
import os

from ..utils import RelaxTuneError
from .indexed import IndexedDatabase, try_normalize
from .records import TuningRecord, Workload

logger = logging.getLogger("relax_tune.database")

WORKLOAD_FILE = "database_workload.json"
TUNING_RECORD_FILE = "database_tuning_record.json"
_MAX_WARNINGS_PER_FILE = 20


def _ensure_dir(path: str, what: str) -> None:
    """Create directory ``path`` (and parents) unless it exists; RelaxTuneError if impossible."""
    if os.path.isdir(path):
        return
    if os.path.exists(path):
        raise RelaxTuneError(f"{what} {path!r} is an existing file, not a directory: pass a "
                             "directory path (it is created when missing) or move the file away")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise RelaxTuneError(f"cannot create {what} {path!r} ({err.strerror or err}): pass a "
                             "directory you can write to") from None


def _read_lines(path: str) -> tuple[list[str], bool]:
    """The lines of ``path`` and whether its last line lacks a newline (a torn write)."""
    with open(path, "rb") as file:
        text = file.read().decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines, bool(text) and not text.endswith("\n")


def _describe(err: BaseException) -> str:
    if isinstance(err, RelaxTuneError):
        return str(err)
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON: {err.msg} at column {err.colno}"
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"


class JSONDatabase(IndexedDatabase):
    """A database stored in MetaSchedule's JSON layout, loaded on construction.

    Give ``work_dir`` (the files are ``work_dir/database_workload.json`` and
    ``work_dir/database_tuning_record.json``; the directory and its parents are created when
    missing), or both paths. ``allow_missing=False`` makes a missing file an error instead of
    creating it empty. Existing files that cannot be written are opened read-only: queries work,
    commits raise RelaxTuneError. Problems a user can fix raise RelaxTuneError naming the path.
    """

    def __init__(self, path_workload: str | os.PathLike | None = None,
                 path_tuning_record: str | os.PathLike | None = None, *,
                 work_dir: str | os.PathLike | None = None, allow_missing: bool = True,
                 module_equality: str = "structural") -> None:
        super().__init__(module_equality)
        if work_dir is not None:
            work_dir = os.fspath(work_dir)
            _ensure_dir(work_dir, "work_dir")
            if path_workload is None:
                path_workload = os.path.join(work_dir, WORKLOAD_FILE)
            if path_tuning_record is None:
                path_tuning_record = os.path.join(work_dir, TUNING_RECORD_FILE)
        if path_workload is None or path_tuning_record is None:
            raise RelaxTuneError("JSONDatabase needs work_dir=... or both path_workload=... and "
                                 "path_tuning_record=...")
        self.path_workload: str = os.fspath(path_workload)
        self.path_tuning_record: str = os.fspath(path_tuning_record)
        self._unwritable: list[str] = []
        self._torn: dict[str, bool] = {}
        for path in (self.path_workload, self.path_tuning_record):
            self._open(path, allow_missing)
        self._load_workloads()
        self._load_records()

    def __repr__(self) -> str:
        return (f"JSONDatabase({self.path_workload!r}, {self.path_tuning_record!r}: "
                f"{len(self)} records, module_equality={self.module_equality!r})")

    @property
    def read_only(self) -> bool:
        """True when the files could be read but not written (commits raise)."""
        return bool(self._unwritable)

    # ------------------------------------------------------------------ files
    def _open(self, path: str, allow_missing: bool) -> None:
        """Check ``path`` can be used, creating it (and its directory) empty when missing."""
        if os.path.isdir(path):
            raise RelaxTuneError(f"database file {path!r} is a directory: pass a work_dir or a "
                                 "file path")
        if os.path.exists(path):
            if not os.access(path, os.R_OK):
                raise RelaxTuneError(f"database file {path!r} is not readable: fix its "
                                     "permissions or pass another work_dir")
            if not os.access(path, os.W_OK):
                self._unwritable.append(path)
            return
        if not allow_missing:
            raise RelaxTuneError(f"database file {path!r} does not exist (allow_missing=False): "
                                 "check the path, or pass allow_missing=True to start empty")
        _ensure_dir(os.path.dirname(os.path.abspath(path)), "database directory")
        try:
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as err:
            raise RelaxTuneError(f"cannot create database file {path!r} "
                                 f"({err.strerror or err}): pass a work_dir you can write to") \
                from None

    def _append(self, path: str, value: list) -> None:
        """Append one JSON line to ``path`` (flushed and fsync'ed)."""
        if path in self._unwritable:
            raise RelaxTuneError(f"database file {path!r} is read-only: commit to a "
                                 "database in a writable work_dir (e.g. copy the files there)")
        line = json.dumps(value, separators=(",", ":"), allow_nan=False) + "\n"
        if self._torn.get(path):
            line = "\n" + line  # end the torn last line first; it stays a (skipped) bad line
        try:
            with open(path, "a", encoding="utf-8") as file:
                file.write(line)
                file.flush()
                os.fsync(file.fileno())
        except OSError as err:
            raise RelaxTuneError(f"cannot append to database file {path!r} "
                                 f"({err.strerror or err}); records already there are intact") \
                from None
        self._torn[path] = False

    def _write_workload(self, workload: Workload, index: int) -> None:
        self._append(self.path_workload, workload.as_json())

    def _write_record(self, record: TuningRecord, index: int) -> None:
        self._append(self.path_tuning_record, [index, record.as_json()])

    # ------------------------------------------------------------------ loading
    def _warn(self, path: str, lineno: int, what: str, err: BaseException | str,
              count: list[int]) -> None:
        count[0] += 1
        if count[0] <= _MAX_WARNINGS_PER_FILE:
            reason = err if isinstance(err, str) else _describe(err)
            logger.warning("%s, line %d: skipped a bad %s (%s); the rest of the file loads",
                           path, lineno, what, reason)

    def _summarise(self, path: str, count: list[int]) -> None:
        if count[0] > _MAX_WARNINGS_PER_FILE:
            logger.warning("%s: %d bad lines skipped in all (%d not shown)", path, count[0],
                           count[0] - _MAX_WARNINGS_PER_FILE)

    def _load_workloads(self) -> None:
        path = self.path_workload
        lines, self._torn[path] = _read_lines(path)
        count = [0]
        for lineno, line in enumerate(lines, start=1):
            try:
                if not line.strip():
                    raise RelaxTuneError("empty line")
                stored = Workload.from_json(json.loads(line))
                mod = try_normalize(stored.mod)
                self._add_workload(Workload(mod, self._equality.hash(mod)))
            except Exception as err:  # untrusted data: any failure skips the line
                self._warn(path, lineno, "workload", err, count)
                self._add_hole()
        self._summarise(path, count)

    def _load_records(self) -> None:
        path = self.path_tuning_record
        lines, self._torn[path] = _read_lines(path)
        count = [0]
        n_workloads = len(self._workloads)
        for lineno, line in enumerate(lines, start=1):
            try:
                if not line.strip():
                    raise RelaxTuneError("empty line")
                value = json.loads(line)
                if not (isinstance(value, list) and len(value) == 2
                        and isinstance(value[0], int) and not isinstance(value[0], bool)):
                    raise RelaxTuneError("a record line must be [workload_index, record]")
                index = value[0]
                if not 0 <= index < n_workloads:
                    raise RelaxTuneError(f"workload index {index} is not a line of "
                                         f"{self.path_workload} ({n_workloads} lines)")
                workload = self._workloads[index]
                if workload is None:
                    raise RelaxTuneError(f"its workload (line {index + 1} of "
                                         f"{self.path_workload}) was skipped")
                record = TuningRecord.from_json(value[1], workload)
            except Exception as err:  # untrusted data: any failure skips the line
                self._warn(path, lineno, "tuning record", err, count)
                continue
            self._add_record(record, index)
        self._summarise(path, count)
