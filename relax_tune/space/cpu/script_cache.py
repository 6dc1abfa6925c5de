"""TVMScript functions parsed once per machine: the parsed function kept on disk as TVM's
JSON, keyed by its text.

The AMX intrinsics are written as TVMScript text (``amx_intrin._source``: their loops and
buffers differ in number from tile to tile), and TVM's parser takes 50-110 ms for one
intrinsic's description and implementation. The design spaces of an int8 ResNet-18 register
about fifty of them, 3.7 s of its tuning process on an Intel Xeon, and again in each build
worker that replays their traces. Loaded from its JSON, a function takes about 8 ms.

The files live in ``$RELAX_TUNE_CACHE_DIR`` (default ``~/.cache/relax_tune``), under
``scripts/``; the key is a hash of the text and of TVM's and its FFI's versions. A cache
that cannot be read or written is passed over: the text is parsed as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from typing import Any

import tvm

from ...machine_cache import cache_root
from ...utils import load_ir_json

logger = logging.getLogger(__name__)


def cache_dir() -> str:
    """Where parsed scripts are kept."""
    return os.path.join(cache_root(), "scripts")


def _key(text: str) -> str:
    import tvm_ffi

    versions = f"{tvm.__version__}|{getattr(tvm_ffi, '__version__', '')}|"
    return hashlib.sha256((versions + text).encode("utf-8")).hexdigest()[:32]


def parse_script(text: str, extra_vars: dict[str, Any]) -> Any:
    """``tvm.script.from_source(text, extra_vars=extra_vars)``, from the cache when this
    machine parsed the same text before."""
    path = os.path.join(cache_dir(), _key(text) + ".json")
    try:
        with open(path, encoding="utf-8") as file:
            return load_ir_json(file.read())
    except FileNotFoundError:
        pass
    except Exception as err:  # noqa: BLE001 - a damaged entry is parsed and written again
        logger.debug("cached script %s unreadable (%s): parsing it", path, err)
    func = tvm.script.from_source(text, extra_vars=extra_vars)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(tvm.ir.save_json(func))
        os.replace(tmp, path)  # whole or not at all, whoever else writes the same key
    except OSError as err:
        logger.debug("cannot keep the parsed script in %s (%s)", path, err)
    return func
