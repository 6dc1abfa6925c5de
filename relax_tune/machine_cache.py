"""Where relax_tune keeps what it learns once per machine and reuses in every later process:
parsed TVMScript intrinsics (``space.cpu.script_cache``) and the int8 probe's answer
(``int8_choice``). Imports nothing of relax_tune."""

from __future__ import annotations

import os


def cache_root() -> str:
    """``$RELAX_TUNE_CACHE_DIR``, default ``~/.cache/relax_tune``."""
    return os.environ.get("RELAX_TUNE_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "relax_tune")
