"""Twin tasks: workloads that differ only in their constants share one search.

A quantized model's layers compute the same thing with their own scales and zero points, and
TVM writes those into each kernel as immediates (``x - 114``, ``* 0.0228``), so the four
layers of a BERT-class int8 encoder give four tasks per kind of kernel where the float32
model gives one: 69 tasks instead of 19. Tuned apart, a time limit is spread four times as
thin, and the layers are tuned to different depths.

A schedule does not depend on those constants: tiling, vectorising and tensorising a loop
nest transform its loops, not the values it computes. So a session tunes one task of each
family of twins (the *leader*, the first in the order given, with the family's call sites as
its weight) and, at its end, gives every other member the leader's best schedule as the
member's predicted schedule (``database.predicted``): chosen, not timed, so nothing ranks it
as a measurement, and ``ApplyDatabase`` uses it where the member has no measured record.
A member whose own loops the leader's trace does not replay on gets nothing.

Twins are found by ``constant_blind``: the workload with every float immediate and every
integer immediate that is an operand of arithmetic on loaded data set to zero. Loop extents,
buffer shapes, indices and bounds stay, so workloads of other shapes or index arithmetic are
never twins.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import tvm
import tvm_ffi

from ..database import Database, is_baseline
from ..database.predicted import PredictedSchedules
from ..utils import load_ir_json, schedule_from_json
from .extract import Task

logger = logging.getLogger(__name__)

_ARITHMETIC = {"prim.Add", "prim.Sub", "prim.Mul", "prim.Div", "prim.FloorDiv",
               "prim.Min", "prim.Max"}
_OPERAND_KEYS = ("a", "b", "value", "args", "condition", "true_value", "false_value")


def constant_blind(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its data constants set to zero (see the module doc)."""
    graph = json.loads(tvm.ir.save_json(mod))
    nodes = graph["nodes"]
    loads: dict[int, bool] = {}

    def loads_data(i: int) -> bool:  # whether expression node i reads a buffer
        if i not in loads:
            loads[i] = False  # a node reached again on its own path reads nothing new
            node = nodes[i]
            if node["type"] == "ir.TensorLoad":
                loads[i] = True
            elif node["type"] == "ffi.Array":
                loads[i] = any(loads_data(j) for j in node["data"])
            elif node["type"].startswith("prim.") or node["type"] == "ir.Call":
                data = node["data"]
                loads[i] = any(loads_data(data[k]) for k in _OPERAND_KEYS
                               if isinstance(data.get(k), int) and data[k] > 0)
        return loads[i]

    zero_int = len(nodes)
    nodes.append({"type": "int", "data": 0})
    for node in list(nodes):
        if node["type"] == "ir.FloatImm":
            node["data"]["value"] = 0.0
        elif node["type"] in _ARITHMETIC:
            data = node["data"]
            for key, other in (("a", "b"), ("b", "a")):
                operand = nodes[data[key]]
                if operand["type"] == "ir.IntImm" and loads_data(data[other]):
                    nodes.append({"type": "ir.IntImm",
                                  "data": {**operand["data"], "value": zero_int}})
                    data[key] = len(nodes) - 1
    return load_ir_json(json.dumps(graph))


@dataclass
class Family:
    """Tasks that are twins: ``leader`` is tuned for all (its weight their call sites);
    ``members`` are the others, in the order given."""

    leader: Task
    first: Task
    """The task given first, whose workload the leader tunes (the leader is a copy of it)."""
    members: list[Task] = field(default_factory=list)


def _kin(task: Task) -> str:
    """What twins have in common before their workloads are compared: the arguments' types
    and shapes, and the name of the fused function with its numbers taken out (TVM numbers
    each fusion of the same operators apart: ``..._add11_tir_clip4...``,
    ``..._add26_tir_clip4...``)."""
    return json.dumps(task.args_info) + re.sub(r"\d+", "", task.task_name)


def twin_families(tasks: Sequence[Task]) -> list[Family]:
    """``tasks`` grouped into families of twins, in the order of their first task. A task of
    a dynamic-shape bucket, or one whose workload cannot be compared, is a family alone.
    Only tasks that share their ``_kin`` with another are compared (a float32 model's
    tasks mostly do not, and the comparison costs about 20 ms a task)."""
    kin = Counter(_kin(task) for task in tasks)
    families: list[Family] = []
    by_hash: dict[int, list[tuple[tvm.IRModule, Family]]] = {}
    for task in tasks:
        blind = None
        if task.shape is None and kin[_kin(task)] > 1:
            try:
                blind = constant_blind(task.mod)
            except Exception as err:  # noqa: BLE001 - then it is tuned alone, as before
                logger.debug("%s: no twin key (%s)", task.task_name, err)
        if blind is not None:
            key = tvm_ffi.structural_hash(blind, map_free_vars=True)
            same = next((fam for mod, fam in by_hash.get(key, [])
                         if tvm_ffi.structural_equal(mod, blind, map_free_vars=True)), None)
            if same is not None:
                same.members.append(task)
                continue
        family = Family(leader=task, first=task)
        families.append(family)
        if blind is not None:
            by_hash.setdefault(key, []).append((blind, family))
    for fam in families:
        if fam.members:
            everyone = [fam.first, *fam.members]
            fam.leader = dataclasses.replace(
                fam.first, weight=sum(t.weight for t in everyone),
                func_names=[n for t in everyone for n in t.func_names])
    return families


def leader_trace(family: Family, db: Database, predicted: PredictedSchedules) -> list | None:
    """The schedule the leader's functions get: its best measured record, unless that is the
    untuned function; else its predicted schedule; else None."""
    leader = family.leader
    record = db.query_tuning_record(leader.mod, leader.target)
    if record is not None:
        return None if is_baseline(record) else record.trace_json
    record = predicted.query_tuning_record(leader.mod, leader.target)
    return None if record is None else record.trace_json


def share_with_twins(families: Sequence[Family], db: Database,
                     predicted: PredictedSchedules) -> list[Task]:
    """Give each family's members the leader's schedule as their predicted schedule (see the
    module doc). Returns the members that got one."""
    shared: list[Task] = []
    for fam in families:
        if not fam.members:
            continue
        try:
            trace = leader_trace(fam, db, predicted)
        except Exception as err:  # noqa: BLE001 - a bad record: the members stay as they are
            logger.warning("%s: its twins get no schedule (%s)", fam.leader.task_name, err)
            continue
        if trace is None:
            continue
        for member in fam.members:
            try:
                schedule_from_json(member.mod, trace)
            except Exception as err:  # noqa: BLE001 - not a twin after all: left as it was
                logger.warning("%s: the schedule of its twin %s does not replay on it (%s)",
                               member.task_name, fam.leader.task_name, err)
                continue
            predicted.add(member.mod, trace, member.target, member.args_info)
            shared.append(member)
    if shared:
        logger.info("%d twin tasks got their leader's schedule", len(shared))
    return shared
