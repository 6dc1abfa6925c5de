"""JSONDatabase: MetaSchedule's on-disk layout, read tolerantly and written append-only.

Two files, one JSON value a line (``tvm.s_tir.meta_schedule.database.JSONDatabase`` reads ours
and we read theirs):

- ``database_workload.json``: ``[str(shash), base64(8-byte LE length + save_json(mod))]``;
  line *i* (from 0) is workload index *i*;
- ``database_tuning_record.json``: ``[workload_index, [trace, run_secs, target, args_info]]``.

Unlike MetaSchedule, ``work_dir`` is created when missing, a corrupt or truncated line is skipped
with a warning naming the file and line while the rest loads, and files whose last line lacks its
newline get one before the next append (so a new line never fuses with a torn one). Loading
never rewrites a file; commits only append. Each commit first takes an exclusive ``flock`` on the
workload file and reads the lines other writers (another JSONDatabase on the same files, in this
process or another) appended since, so workload indices never collide.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import tvm
from tvm import tirx

try:
    import fcntl
except ImportError:  # not POSIX: no inter-process locking
    fcntl = None  # type: ignore[assignment]

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


def _describe(err: BaseException) -> str:
    if isinstance(err, RelaxTuneError):
        return str(err)
    if isinstance(err, json.JSONDecodeError):
        return f"not JSON: {err.msg} at column {err.colno}"
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"


_DECODER = json.JSONDecoder()
_MAX_KNOWN_INSTS = 64


def parse_record_line(line: str, known: dict[str, list[tuple[str, list]]]) -> Any:
    """``json.loads(line)`` for a record line, faster for the lines this module writes.

    Records of one design-space sketch share their instruction list text; only decisions,
    times, target and args differ. For a compact line ``[i,[[INSTS,DECISIONS],...]]`` whose
    INSTS text is one of ``known`` (``(text, parsed)``, most recent first; updated here), the
    parsed list is shared instead of parsed again (``known`` maps a workload index to its list), and the rest is parsed piece by piece.
    Anything else -- other spacing, another shape, a bad line -- goes through ``json.loads``,
    so the result (or the error) is exactly what ``json.loads`` gives. Shared instruction lists
    are never modified by this package."""
    try:
        comma = line.index(",", 1)
        if line[0] != "[" or not line.startswith(",[[[", comma) or \
                not line[1:comma].isdigit():
            return json.loads(line)
        start = comma + 3
        known = known.setdefault(line[1:comma], [])
        for pos, (text, insts) in enumerate(known):
            if line.startswith(text, start):
                end = start + len(text)
                if pos:
                    known.insert(0, known.pop(pos))
                break
        else:
            insts, end = _DECODER.raw_decode(line, start)
            known.insert(0, (line[start:end], insts))
            del known[_MAX_KNOWN_INSTS:]
        if line[end] != ",":
            return json.loads(line)
        decisions, end = _DECODER.raw_decode(line, end + 1)
        if not line.startswith("],", end):
            return json.loads(line)
        rest = []
        end += 1
        for _ in range(3):  # run_secs, target, args_info
            if line[end] != ",":
                return json.loads(line)
            value, end = _DECODER.raw_decode(line, end + 1)
            rest.append(value)
        if line[end:].rstrip() != "]]":
            return json.loads(line)
        return [int(line[1:comma]), [[insts, decisions], *rest]]
    except (ValueError, IndexError):
        return json.loads(line)


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
        self._offset: dict[str, int] = {}  # bytes of each file consumed so far
        self._lines: dict[str, int] = {}  # lines of each file consumed so far
        self._torn: dict[str, bool] = {}  # whether the last consumed line lacks its newline
        # records filed under workload indices the workload file lacks: index -> count
        self._orphans: dict[int, int] = {}
        for path in (self.path_workload, self.path_tuning_record):
            self._open(path, allow_missing)
            self._offset[path], self._lines[path], self._torn[path] = 0, 0, False
        with self._locked(shared=True):
            pass

    def __repr__(self) -> str:
        return (f"JSONDatabase({self.path_workload!r}, {self.path_tuning_record!r}: "
                f"{len(self)} records, module_equality={self.module_equality!r})")

    @property
    def read_only(self) -> bool:
        """True when the files could be read but not written (commits raise)."""
        return bool(self._unwritable)

    def refresh(self) -> None:
        """Load the lines other writers appended to the files since this database read them."""
        with self._locked(shared=True):
            pass

    def commit_workload(self, mod: tvm.IRModule | tirx.PrimFunc) -> Workload:
        """As ``Database.commit_workload``; a new workload is appended to the workload file."""
        with self._locked():
            return super().commit_workload(mod)

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """As ``Database.commit_tuning_record``; the record is appended to the record file."""
        with self._locked():
            super().commit_tuning_record(record)

    # ------------------------------------------------------------------ files
    @contextlib.contextmanager
    def _locked(self, shared: bool = False) -> Iterator[None]:
        """Hold a lock on the workload file and catch up with other writers' lines first."""
        try:
            lock = open(self.path_workload, "rb")
        except OSError as err:
            raise RelaxTuneError(f"cannot open database file {self.path_workload!r} "
                                 f"({err.strerror or err}): was it moved or deleted?") from None
        with lock:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                try:
                    self._read_new()
                except OSError as err:
                    raise RelaxTuneError(f"cannot read database file {err.filename!r} "
                                         f"({err.strerror or err}): was it moved or deleted?") \
                        from None
                yield
            finally:
                if fcntl is not None:
                    fcntl.flock(lock, fcntl.LOCK_UN)

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
        data = line.encode("utf-8")
        try:
            with open(path, "ab") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
        except OSError as err:
            raise RelaxTuneError(f"cannot append to database file {path!r} "
                                 f"({err.strerror or err}); records already there are intact") \
                from None
        self._offset[path] += len(data)
        self._lines[path] += 1
        self._torn[path] = False

    def _write_workload(self, workload: Workload, index: int) -> None:
        if self._orphans and index <= max(self._orphans):
            low, high = min(self._orphans) + 1, max(self._orphans) + 1
            lines = f"line {low}" if low == high else f"lines {low}-{high}"
            raise RelaxTuneError(
                f"{self.path_tuning_record} holds {sum(self._orphans.values())} records of "
                f"workload {lines} of {self.path_workload}, which it lacks (emptied or cut "
                "short?): a new workload would take their place and their times. Restore the "
                "workload file, or tune into another work_dir")
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

    def _new_lines(self, path: str) -> Iterator[tuple[int, str]]:
        """The (1-based line number, text) of the lines appended to ``path`` since last read.

        A last line without its newline (a torn write) is returned too and remembered, so the
        next append starts a new line; if a later reader finds it continued, the continuation is
        dropped (the torn line was already counted)."""
        offset = self._offset[path]
        size = os.path.getsize(path)
        if size < offset:
            logger.warning("%s shrank from %d to %d bytes since it was loaded: something else "
                           "rewrote it; reopen the database to see its contents", path, offset,
                           size)
            self._offset[path] = size
            return
        if size == offset:
            return
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read(size - offset)
        self._offset[path] = offset + len(data)
        chunks = data.split(b"\n")
        if chunks[-1] == b"":
            chunks.pop()
        if self._torn[path] and chunks:
            chunks.pop(0)
        self._torn[path] = not data.endswith(b"\n")
        first = self._lines[path] + 1
        self._lines[path] += len(chunks)
        for lineno, chunk in enumerate(chunks, start=first):
            yield lineno, chunk.decode("utf-8", errors="replace")

    def _read_new(self) -> None:
        """Load the workload lines, then the record lines, not read yet."""
        # Loading builds millions of small lists (traces); the cyclic collector would walk the
        # growing heap again and again (docs/design/database.md, "Loading large files").
        # Nothing parsed here forms cycles, so it is paused while reading.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            self._read_new_workloads()
            self._read_new_records()
        finally:
            if was_enabled:
                gc.enable()

    def _read_new_workloads(self) -> None:
        path = self.path_workload
        count = [0]
        for lineno, line in self._new_lines(path):
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

    @staticmethod
    def _parse_record(obj: Any, workload: Workload, checked: set[int]) -> TuningRecord:
        insts = obj[0][0] if isinstance(obj, list) and obj and isinstance(obj[0], list) \
            and obj[0] else None
        if insts is not None and id(insts) in checked:
            return TuningRecord.from_json(obj, workload, insts_checked=True)
        record = TuningRecord.from_json(obj, workload)
        if type(insts) is list:
            checked.add(id(insts))  # alive as long as the load: ids are not reused
        return record

    def _read_new_records(self) -> None:
        path = self.path_tuning_record
        count = [0]
        known: dict[str, list[tuple[str, list]]] = {}
        checked: set[int] = set()  # ids of shared instruction lists that passed the check
        n_workloads = len(self._workloads)
        for lineno, line in self._new_lines(path):
            try:
                if not line.strip():
                    raise RelaxTuneError("empty line")
                value = parse_record_line(line, known)
                if not (isinstance(value, list) and len(value) == 2
                        and isinstance(value[0], int) and not isinstance(value[0], bool)):
                    raise RelaxTuneError("a record line must be [workload_index, record]")
                index = value[0]
                if not 0 <= index < n_workloads:
                    if index >= n_workloads:
                        self._orphans[index] = self._orphans.get(index, 0) + 1
                    raise RelaxTuneError(f"workload index {index} is not a line of "
                                         f"{self.path_workload} ({n_workloads} lines)")
                workload = self._workloads[index]
                if workload is None:
                    raise RelaxTuneError(f"its workload (line {index + 1} of "
                                         f"{self.path_workload}) was skipped")
                record = self._parse_record(value[1], workload, checked)
                self._check_args(record, index)
            except Exception as err:  # untrusted data: any failure skips the line
                self._warn(path, lineno, "tuning record", err, count)
                continue
            self._add_record(record, index)
        self._summarise(path, count)
