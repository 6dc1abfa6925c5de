"""Module equality: how a database decides that two workloads are "the same".

- ``"structural"``: structural hash/equality of the whole module (MetaSchedule's default);
- ``"ignore-tensor"``: the same, ignoring the contents of constant tensors
  (``"ignore-ndarray"``, its name up to TVM 0.21, is accepted too);
- ``"anchor-block"``: hash/equality of the anchor block only (the dominant compute block,
  ``tvm.s_tir.analysis.find_anchor_sblock``), ignoring tensor contents; modules without an
  anchor block fall back to ``"ignore-tensor"``.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm.s_tir.analysis import find_anchor_sblock

from ..utils import RelaxTuneError, structural_hash

MODULE_EQUALITIES = ("structural", "ignore-tensor", "anchor-block")


class ModuleEquality:
    """Hash and equality of workload modules under one of ``MODULE_EQUALITIES``."""

    def __init__(self, name: str = "structural") -> None:
        if name == "ignore-ndarray":
            name = "ignore-tensor"
        if name not in MODULE_EQUALITIES:
            raise RelaxTuneError(
                f"unknown module_equality {name!r}; use one of {', '.join(MODULE_EQUALITIES)}")
        self.name = name

    def __repr__(self) -> str:
        return f"ModuleEquality({self.name!r})"

    def hash(self, mod: tvm.IRModule) -> int:
        """The hash of ``mod`` under this equality (what the workload file stores)."""
        if self.name == "structural":
            return structural_hash(mod)
        if self.name == "anchor-block":
            block = find_anchor_sblock(mod)
            if block is not None:
                return int(tvm_ffi.structural_hash(block, map_free_vars=False,
                                                   skip_tensor_content=True))
        return structural_hash(mod, ignore_tensor=True)

    def equal(self, lhs: tvm.IRModule, rhs: tvm.IRModule) -> bool:
        """True when ``lhs`` and ``rhs`` are the same workload under this equality."""
        if self.name == "structural":
            return bool(tvm_ffi.structural_equal(lhs, rhs))
        if self.name == "anchor-block":
            block_l, block_r = find_anchor_sblock(lhs), find_anchor_sblock(rhs)
            if block_l is not None and block_r is not None:
                return bool(tvm_ffi.structural_equal(block_l, block_r, map_free_vars=False,
                                                     skip_tensor_content=True))
        return bool(tvm_ffi.structural_equal(lhs, rhs, skip_tensor_content=True))
