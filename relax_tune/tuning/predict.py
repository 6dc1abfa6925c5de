"""The no-measurement compile: each task's schedule transferred or chosen by the cost
model, nothing timed.

``predict_schedules`` asks every task's search for its ``best_predicted`` candidate: the
refitted best schedule of the closest alike workload tuned on a machine of this class (the
work_dir's or the shipped library's, ``relax_tune.transfer``) where one is close enough,
else the one its model (the shipped pre-trained one, ``cost_model="xgb-prior"``) ranks
first in a pool grown within the task's share of the time; and records it in the work_dir's
predicted schedules (``database.predicted``). ``ApplyDatabase`` uses a predicted schedule where the work_dir has
no measurement of the task, so a session with a time limit also leaves the tasks it never
reached with their predicted schedules instead of their untuned code.

"Never slower than untuned", without measuring: only a candidate that tiles the task's
loops for data reuse (the multi-level tiling of matmuls, convolutions and attention,
``space.params.ANN_TILED``) is recorded. Such a task's untuned function is one serial loop
nest over the whole reduction; the tiled candidates run in parallel, vectorised, with their
tiles in cache, and measured 19x to 136x faster than it on the first try (the first
candidate of each of ResNet-18's convolutions and matmuls, docs/results/one-minute-tuning.md).
Elementwise, layout, pooling and normalisation tasks get one only when their largest block
runs ``MIN_UNTILED_ITERATIONS`` iterations or more (``work_iterations``), and only a
candidate that passes ``safe_untiled`` (no vector narrower than a register, no innermost
reduction unrolled, no strided walk that evicts its own L1 lines where the untuned loop's
does not): on less, a parallel loop's start-up can cost
more than the untuned loop; on more, the untuned function is a single-threaded scalar loop
nest (ResNet-18's Winograd layout, gather and pooling tasks measured 80x-800x slower
untuned than their best schedule after 300 s of tuning, docs/design/time-budget.md).
Smaller ones keep their untuned code until measured, and so do tiled tasks of fewer than
``MIN_TILED_FLOPS`` operations (a classifier's 1x64 by 64x10 matmul: its untuned loop is
shorter than a parallel schedule's start).

Where the model's best candidates vectorise an odd width (more than one SIMD register, not a
whole number of half registers: 29 floats of a 116-channel convolution), the model's first
among its 64 best that does not (``whole_vectors``) is chosen instead. LLVM legalises an
odd-width vector piece by piece, and such candidates took from 0.1x to 4x the untuned
function's time; the pre-trained model cannot tell which, and ranked them first. On
ShuffleNetV2's 1x1 convolutions of 58 and 116 channels, its ten best on the 116-channel one
ran 321-882 us against 219 us untuned; its first on whole vectors ran 1.5x-3.2x faster than
untuned on each of four such tasks (docs/results/zen3-epyc.md, session 20). Among those, the
model's first whose tiled compute runs in vectors of half a register or more is preferred,
then one whose compute is vectorised at all (``vectorises_the_compute``, ``_accept_on``);
at each step one whose compute vectors span a power of two bytes first
(``power_of_two_compute_vectors``: a 3-register accumulator ran up to 5.8x the untuned time).
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import Schedule

from ..database.predicted import PredictedSchedules
from ..space import analysis as A
from ..space.params import ANN_TILED, dtype_bytes, target_params
from ..space.verify import widest_element
from ..utils import trace_to_json
from .state import TaskState

logger = logging.getLogger(__name__)


def tiles_for_reuse(trace_json: list) -> bool:
    """Whether a candidate's trace tiles a block for data reuse: a rule's ``ANN_TILED``, or
    a ``Tensorize`` (the int8 and AMX sketches compute register tiles on the instruction;
    their untuned function is a serial scalar loop nest, 28x-580x slower on the Intel Xeon,
    docs/design/int8.md)."""
    text = json.dumps(trace_json)
    return ANN_TILED in text or '"Tensorize"' in text


MIN_UNTILED_ITERATIONS = 32768
"""A task that does not tile for reuse (elementwise, layout, pooling, normalisation) gets a
predicted schedule only when its largest block runs this many iterations: its untuned
function then runs long enough on one core (tens of microseconds and up) that a parallel,
vectorised schedule cannot lose by its threads' start-up. At 16384 it could: a global
average pool's sum over 64x16x16 ran 10.9 us predicted against 9.3 us untuned with the
other core busy (Intel Xeon, 2 threads); over 128x16x16, 21 us against 40 us. Counted
as iterations, not as the largest tensor's elements: ViT's class-token ``take`` reads a
197 x 192 tensor but writes 192 floats, and ran 1.0 us predicted against 0.05 untuned."""


MIN_TILED_FLOPS = 8192
"""A task that tiles for reuse gets a predicted schedule only when it computes this many
floating-point operations: below, its untuned loop nest is over before a parallel
schedule's threads have started. Measured (2 threads, each predicted schedule against the
untuned function in the tuner's runner): on an AMD EPYC Zen 3, a 1x64 by 64x10 matmul with
bias, 1.3e3 FLOPs, ran 0.14 us untuned against 1.22 us predicted; 1x128 by 128x32, 8.2e3
FLOPs, 1.14 us against 0.17 us, and every larger one faster still. On a Zen 4,
EfficientNet-B0's squeeze-and-excite matmul 1x240 by 240x10 with bias and SiLU, 6.4e3
FLOPs, ran 0.73 us untuned against 1.35 us predicted (docs/results/zen4-epyc.md,
session 29)."""


def _vector_sizes(func: tirx.PrimFunc) -> list[int]:
    """Bytes of each vectorised loop of ``func`` (its width times the widest element its
    stores write)."""
    sizes: list[int] = []

    def on_loop(loop: tirx.For) -> None:
        if loop.kind == tirx.ForKind.VECTORIZED and isinstance(loop.extent, tirx.IntImm):
            sizes.append(int(loop.extent) * widest_element(loop.body))

    tvm_ffi.structural_walk(func.body, [(tirx.For, on_loop)])
    return sizes


def whole_vectors(func: tirx.PrimFunc, vector_bytes: int) -> bool:
    """Whether every vectorised loop of the scheduled ``func`` fills one SIMD register of
    ``vector_bytes`` at most, or a whole number of half registers (its width times the
    bytes of the widest element its stores write). A register and a half is two pieces for
    LLVM, not an odd width: with such vectors allowed, MobileNetV3-Small's no-measurement
    compile went 0.84x -> 0.96x ONNX Runtime (its 14x14 1x1 convolution from 240 to 40
    channels 76 -> 26 us a call, its 5x5 depthwise one on 120 channels 34 -> 16 us), and
    ShuffleNetV2's 1x1 convolutions on 28x28x58 76 -> 44 us a call (AMD EPYC Zen 4, 2
    threads)."""
    return all(size <= vector_bytes or size % (vector_bytes // 2) == 0
               for size in _vector_sizes(func))


def unrolls_inner_reduction(sch: Schedule, vector_bytes: int) -> bool:
    """Whether the schedule unrolls an innermost reduction loop long enough to fill a vector:
    the serial loop right above a block that a reduction iteration uses, of at least one
    register's elements, under a ``pragma_auto_unroll_max_step`` of at least its extent.
    The untuned function's innermost reduction is what LLVM's loop vectoriser turns into
    vector code; unrolled, it stays one scalar step per element (a pooling window's 3 taps
    are no such loop)."""
    for block in A.collect_blocks(sch):
        loops = A.loops_of(sch, block)
        if not loops:
            continue
        inner = A.node(sch, loops[-1])
        extent = A.loop_extent(sch, loops[-1])
        if (extent is None or int(inner.kind) != A.FOR_SERIAL
                or A.loop_iter_type(sch, loops[-1]) != "R"
                or extent * widest_element(inner.body) < vector_bytes):
            continue
        steps = [A.node(sch, loop).annotations.get("pragma_auto_unroll_max_step")
                 for loop in loops]
        if any(step is not None and extent <= int(step) for step in steps):
            return True
    return False


def leaves_nothing_to_vectorise(sch: Schedule, vector_bytes: int) -> bool:
    """Whether a schedule with no vector loop fuses a block's loops into its parallel loop
    down to the last one, where the block writes rows of at least one register: no inner
    loop is left for LLVM's loop vectoriser, which vectorises the untuned function's.
    ResNet-18's 7x7x512 Winograd epilogue (the tiles back to NHWC, cropped, the residual,
    ReLU) ran so as one parallel loop of 25,088 scalar steps, each dividing its way
    through the reshapes: 39.9 us against 13.4 untuned (Zen 4, docs/results/zen4-epyc.md).
    A parallel loop that holds other loops too does more than one scalar step an iteration
    (a global average pool's division under the loop of its 49 sums, 2.1 us against 2.6
    untuned), and is left to the other checks."""
    if any(_vector_sizes(f) for f in _prim_funcs(sch.mod)):
        return False
    for block in A.collect_blocks(sch):
        loops = A.loops_of(sch, block)
        inner = A.node(sch, loops[-1]) if loops else None
        if inner is None or int(inner.kind) != A.FOR_PARALLEL or _holds_a_loop(inner.body):
            continue
        writes = A.node(sch, block).writes
        shape = getattr(writes[0].source, "shape", None) if writes else None
        row = shape[-1] if shape else None
        if isinstance(row, tirx.IntImm) and int(row) * widest_element(inner.body) >= vector_bytes:
            return True
    return False


def _holds_a_loop(stmt) -> bool:
    """Whether ``stmt`` holds a loop of more than one iteration."""
    found: list = []
    tvm_ffi.structural_walk(stmt, [(tirx.For, lambda loop: found.append(loop)
                                    if not (isinstance(loop.extent, tirx.IntImm)
                                            and int(loop.extent) == 1) else None)])
    return bool(found)


CACHE_LINE = 64
L1_SETS = 64
"""An L1 data cache indexed within a 4 KiB page holds 64 sets of 64-byte lines, whatever its
size (x86 cores: 32 KiB 8-way, 48 KiB 12-way)."""
L1_WAYS = 8
"""The fewest ways of those L1s: the lines one set can hold."""


def thrashes_l1(sch: Schedule) -> bool:
    """Whether a block's innermost stepping loop walks an access across more cache lines of
    the same L1 sets than the sets hold: a stride of a whole number of lines reaches only
    ``L1_SETS / gcd(stride in lines, L1_SETS)`` sets, ``L1_WAYS`` lines each, and a longer
    walk evicts its own lines before the next outer iteration comes back to read their
    neighbours. (BERT's key transposed by one inlined loop read 128 rows 1 KiB apart, 128
    lines in 4 sets: 24.6 us against 17.3 untuned, whose copies read 256 bytes apart.)"""
    for block in A.collect_blocks(sch):
        loops = [lp for lp in A.loops_of(sch, block)
                 if A.loop_kind(sch, lp) != A.FOR_VECTORIZED
                 and (A.loop_extent(sch, lp) or 0) > 1]
        if not loops:
            continue
        extent = A.loop_extent(sch, loops[-1])
        for stride, size in A.stepped_strides(sch, block, loops[-1]):
            span = abs(stride or 0) * size
            if span < CACHE_LINE or span % CACHE_LINE:
                continue
            sets = L1_SETS // math.gcd(span // CACHE_LINE, L1_SETS)
            if extent > sets * L1_WAYS:
                return True
    return False


def safe_untiled(sch: Schedule, vector_bytes: int, untuned_thrashes: bool = False) -> bool:
    """Whether an unmeasured schedule of a task that does not tile for reuse keeps clear of
    the four ways such schedules ran slower than the untuned function: a vector narrower
    than one SIMD register (ResNet-18's input NCHW -> NHWC transpose vectorised its 3
    channels, read 224 x 224 floats apart: 26.0 us against 19.7 untuned), an innermost
    reduction unrolled explicitly (ViT's mask reduction over 197, unrolled whole: 30.6 us
    against 17.7) (docs/results/zen3-epyc.md, session 23), a walk that evicts its own
    lines from L1 where the untuned function's does not (``thrashes_l1``; where both do,
    the parallel schedule still won: ViT's transposed key, 15.6 us against 39.4 untuned),
    and no vector loop with no inner loop left for LLVM's vectoriser either
    (``leaves_nothing_to_vectorise``)."""
    return (all(size >= vector_bytes for f in _prim_funcs(sch.mod) for size in _vector_sizes(f))
            and not unrolls_inner_reduction(sch, vector_bytes)
            and not leaves_nothing_to_vectorise(sch, vector_bytes)
            and (untuned_thrashes or not thrashes_l1(sch)))


def _prim_funcs(mod: tvm.IRModule) -> list[tirx.PrimFunc]:
    return [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]


def _row_bytes(task) -> int | None:
    """Bytes of one row (the innermost dimension) of the task's output, its last argument;
    None where that is not a tensor of constant shape."""
    last = task.args_info[-1] if task.args_info else None
    if not last or last[0] != "TENSOR" or not last[2] or not isinstance(last[2][-1], int):
        return None
    return int(last[2][-1]) * dtype_bytes(last[1])


def _tiled_compute_vectors(func: tirx.PrimFunc) -> list[int]:
    """Bytes of each vector loop of the scheduled ``func`` that holds a tiled block's
    update (``ANN_TILED``): the compute's own vectors, not an epilogue's, an init's or a
    layout copy's."""
    sizes: list[int] = []

    def on_loop(loop: tirx.For) -> None:
        if loop.kind != tirx.ForKind.VECTORIZED or not isinstance(loop.extent, tirx.IntImm):
            return
        if _is_tiled(loop.body):
            sizes.append(int(loop.extent) * widest_element(loop.body))

    tvm_ffi.structural_walk(func.body, [(tirx.For, on_loop)])
    return sizes


def _is_tiled(stmt) -> bool:
    """Whether ``stmt`` holds a tiled block that reads (its update, not its init)."""
    found: list = []
    tvm_ffi.structural_walk(stmt, [(tvm.s_tir.SBlock, lambda b: found.append(b)
                                    if ANN_TILED in b.annotations and len(b.reads) else None)])
    return bool(found)


def vectorises_the_compute(func: tirx.PrimFunc, vector_bytes: int, row_bytes: int | None,
                           full: bool) -> bool:
    """Whether the scheduled ``func``'s tiled compute runs in a vector loop (``full``: one of
    half a SIMD register of ``vector_bytes`` or more, or of a whole output row where rows
    are narrower, ``row_bytes``). True for a function with no tiled block, and, unless
    ``full``, where output rows are narrower than half a register."""
    if not _is_tiled(func.body):
        return True
    half = vector_bytes // 2
    need = half if row_bytes is None else min(half, row_bytes)
    if not full and need < half:
        return True
    return max(_tiled_compute_vectors(func), default=0) >= (need if full else 1)


def power_of_two_compute_vectors(func: tirx.PrimFunc) -> bool:
    """Whether every vector loop of the scheduled ``func``'s tiled compute spans a power of
    two bytes (one register, two, four, or a part of one that is a power of two). A
    multiply-accumulate over three registers' width (48 floats), kept in registers across
    the reduction, is a vector type LLVM widens to four and then moves piece by piece
    through the stack on every step: EfficientNet-B0's 7x7x192 -> 1152 1x1 convolution (the
    ONNX file's, with its SiLU) ran 1,158 us so against 612 us untuned and 103 us on
    16-float vectors with the same tiles (AMD EPYC Zen 4, 2 threads). Among 48 random
    draws of each of eight convolutions and matmuls, the fastest on 192-byte vectors ran
    1.13x-1.89x the fastest draw (the slowest 4.1x-5.8x the untuned function on three
    tasks), on other widths that are no power of two (12-160 bytes) 1.6x-16.5x, while the
    fastest draw of every task was on a power of two (docs/results/zen4-epyc.md, session
    28)."""
    return all(size & (size - 1) == 0 for size in _tiled_compute_vectors(func))


MIN_ACCUMULATORS = 8
"""Vector registers of accumulators a tiled compute's register tile should hold, on targets
of 16 registers or more (half the registers at most): a multiply-add's latency (4 cycles
for FMA and ``vpdpbusd`` on AMD Zen 3/4 and Intel cores) times the two units that start one
a cycle. A tile of fewer is latency-bound. The pre-trained model ranked first 1-row tiles
of 4 vectors: ResNet-18 int8's stride-2 convolutions ran 295-334 us predicted against
148-156 us on 7- and 14-row tiles of 2-4 vectors, its 1x1 one 68 us on 4 accumulators
against 26 on 14; ViT's attention-by-values matmul (197 prime rows) 129 us on 1 x 4 against
75 us tuned on 8 x 1 (AMD EPYC Zen 4, 2 threads)."""


def accumulator_registers(sch: Schedule, vector_bytes: int) -> int | None:
    """Vector registers of accumulators in the scheduled function's largest register tile:
    for each block that reduces, the elements it updates under its innermost reduction
    loop (the loops inside that loop times what one block instance writes: one element,
    or an instruction's lanes), in registers of ``vector_bytes``; the largest over the
    blocks. None for a function that does not reduce."""
    best = None
    for block in A.collect_blocks(sch):
        if A.is_root(sch, block) or A.COMM_REDUCE not in A.iter_types(sch, block):
            continue
        loops = A.loops_of(sch, block)
        kinds = [A.loop_iter_type(sch, loop) for loop in loops]
        inner = max((i for i, kind in enumerate(kinds) if kind == "R"), default=-1)
        write = A.node(sch, block).writes[0]
        sizes = [A.loop_extent(sch, loop) for loop in loops[inner + 1:]] + \
            [A._const_int(r.extent) for r in write.region]
        if any(size is None for size in sizes):
            continue
        registers = math.prod(sizes) * dtype_bytes(str(write.source.dtype)) // vector_bytes
        best = max(best or 0, registers)
    return best


def _accept_on(task) -> tuple:
    """The checks a predicted candidate of ``task`` must pass, in order of preference
    (``best_predicted`` takes the first of the model's best that passes the first check,
    else the second, ...):

    1. whole vectors (``whole_vectors``), the tiled compute in vectors of half a register
       or more (``vectorises_the_compute``) that span a power of two bytes
       (``power_of_two_compute_vectors``), for one that does not tile for reuse
       ``safe_untiled``, and for one that tiles a register tile of ``MIN_ACCUMULATORS``
       registers or more (``accumulator_registers``; half the target's registers where it
       has fewer than 16: an untiled global average pool so steered ran 64 us against 58
       untuned and 40 unsteered, EfficientNet-B0, Zen 4);
    2. the same with any register tile;
    3. the same on compute vectors of any width;
    4. and 5. the second and third with narrower vectors allowed, but not none where output rows
       span half a register. A tiled schedule that vectorised no compute ran ShuffleNetV2's
       56x56 1x1 convolution to 58 channels in 756 us against 187 us untuned (103 us now),
       and one on 2-float vectors its 116-channel depthwise one in 72 against 18 us (18
       now; AMD EPYC Zen 4, docs/design/time-budget.md)."""
    vector_bytes = target_params(task.target).vector_bytes
    row_bytes = _row_bytes(task)
    # read once, at the first untiled candidate
    untuned_thrashes = functools.cache(lambda: thrashes_l1(Schedule(task.mod)))

    def by_candidate(check):
        """``check`` asked once per candidate: the four steps ask it of the same ones."""
        seen: dict[str, bool] = {}

        def cached(cand) -> bool:
            if cand.key not in seen:
                seen[cand.key] = check(cand)
            return seen[cand.key]
        return cached

    @by_candidate
    def accept(cand) -> bool:
        if not all(whole_vectors(f, vector_bytes) for f in _prim_funcs(cand.sch.mod)):
            return False
        if not _compute_vectorised(cand, vector_bytes, row_bytes, full=False):
            return False
        return (tiles_for_reuse(cand.trace_json)
                or safe_untiled(cand.sch, vector_bytes, untuned_thrashes()))

    full = by_candidate(lambda cand: _compute_vectorised(cand, vector_bytes, row_bytes,
                                                         full=True))
    power_of_two = by_candidate(lambda cand: all(power_of_two_compute_vectors(f)
                                                 for f in _prim_funcs(cand.sch.mod)))

    params = target_params(task.target)
    least = min(MIN_ACCUMULATORS, params.vector_registers // 2)

    @by_candidate
    def enough(cand) -> bool:
        if not tiles_for_reuse(cand.trace_json):
            return True  # a pool or a norm's sum: its speed is memory and threads
        try:
            return (accumulator_registers(cand.sch, vector_bytes) or least) >= least
        except Exception:  # noqa: BLE001 - a preference only: never a reason to fail
            return True

    def prefer(cand) -> bool:
        return accept(cand) and full(cand)

    return (lambda cand: prefer(cand) and power_of_two(cand) and enough(cand),
            lambda cand: prefer(cand) and power_of_two(cand), prefer,
            lambda cand: accept(cand) and power_of_two(cand), accept)


def _compute_vectorised(cand, vector_bytes: int, row_bytes: int | None, full: bool) -> bool:
    """``vectorises_the_compute`` of every function of the candidate's module."""
    return all(vectorises_the_compute(f, vector_bytes, row_bytes, full)
               for f in _prim_funcs(cand.sch.mod))


def _transfer_fits(task):
    """The check a schedule transferred from an alike workload must pass to be applied
    unmeasured: it vectorises this task's compute (``vectorises_the_compute``). Its vector
    loop can fall on an index that is not linear here: a depthwise convolution's schedule
    on RegNetX's grouped one vectorised none of it, 840 us a call against 55 us predicted
    (AMD EPYC Zen 4, 2 threads)."""
    vector_bytes = target_params(task.target).vector_bytes
    row_bytes = _row_bytes(task)
    return lambda cand: _compute_vectorised(cand, vector_bytes, row_bytes, full=False)


def work_iterations(task) -> int:
    """Iterations of the task's largest block (the product of its iteration extents: the
    elements a layout or elementwise task writes, those a reduction reads), or, where an
    extent is symbolic, the elements of its largest tensor argument."""
    blocks: list = []
    for func in _prim_funcs(task.mod):
        tvm_ffi.structural_walk(func.body, [(tvm.s_tir.SBlock, blocks.append)])
    extents = [[iv.dom.extent for iv in block.iter_vars] for block in blocks]
    if blocks and all(isinstance(e, tirx.IntImm) for ext in extents for e in ext):
        return max(math.prod(int(e) for e in ext) for ext in extents)
    sizes = [math.prod(int(d) for d in arg[2]) for arg in task.args_info
             if arg and arg[0] == "TENSOR"]
    return max(sizes, default=0)


def may_tile(search: object) -> bool:
    """Whether a task's design space holds candidates that tile for reuse (a search that
    does not show its sketches may)."""
    sketches = getattr(search, "sketches", None)
    return sketches is None or any(tiles_for_reuse(trace_to_json(s)) for s in sketches)


def wants_prediction(st: TaskState) -> bool:
    """Whether the no-measurement choice looks for a schedule of ``st``'s task: one with no
    measured candidate yet that tiles for reuse (``MIN_TILED_FLOPS`` and more) or runs
    ``MIN_UNTILED_ITERATIONS``; else its untuned code stays (or its measurement applies)."""
    large = work_iterations(st.task) >= MIN_UNTILED_ITERATIONS
    if 0 < st.task.flops < MIN_TILED_FLOPS and not large:
        return False  # so little work that a thread pool's start costs more than all of it
    return st.report.best_secs is None and (large or may_tile(st.search))


def choose(st: TaskState) -> list | None:
    """The trace (as JSON) of the schedule ``st``'s task runs unmeasured: its search's
    ``best_predicted`` under the checks of ``_accept_on``; None where its untuned code stays
    (no candidate, or a task that does not tile whose best candidates are none safe)."""
    checks = _accept_on(st.task)
    cand = st.search.best_predicted(st.measured, checks, fits=_transfer_fits(st.task))
    if cand is None:
        return None
    if tiles_for_reuse(cand.trace_json) or (
            work_iterations(st.task) >= MIN_UNTILED_ITERATIONS and checks[-1](cand)):
        return cand.trace_json
    return None


def replays_of(st: TaskState) -> int:
    """Candidates ``st``'s search has replayed."""
    return getattr(st.search, "stats", {}).get("replays", 0)


def choose_here(order: list[TaskState], deadline: float | None):
    """``(state, trace JSON or None, replays, error or None)`` of each task of ``order`` in
    turn, chosen in this process, until ``deadline`` (time.monotonic)."""
    for st in order:
        if deadline is not None and time.monotonic() >= deadline:
            return
        try:
            yield st, choose(st), replays_of(st), None
        except Exception as err:  # noqa: BLE001 - the task keeps its untuned code
            yield st, None, replays_of(st), str(err)


def predict_schedules(states: list[TaskState], predicted: PredictedSchedules,
                      deadline: float | None = None, choices=choose_here,
                      on_choice=None) -> int:
    """Record each task's top-ranked candidate (a task that tiles for reuse and has no
    measured candidate yet) in ``predicted``, the heaviest tasks first, until ``deadline``
    (time.monotonic). ``choices(order, deadline)`` chooses them (``choose_here``, or
    ``predict_pool.WorkerChoices``: in a session's workers too); ``on_choice(done, total)``
    hears of each (``Progress.predicted``), and of the start. Returns how many were
    recorded (their reports say ``predicted``)."""
    count = 0
    order = [st for st in sorted(states, key=lambda st: -st.task.weight * st.task.cost)
             if wants_prediction(st)]
    done = 0
    if on_choice is not None and order:
        on_choice(0, len(order))
    for st, trace_json, replays, error in choices(order, deadline):
        done += 1
        if on_choice is not None:
            on_choice(done, len(order))
        if error is not None:
            logger.warning("%s: no predicted schedule (%s)", st.report.task_name, error)
            continue
        if trace_json is None:
            continue  # small, or no untiled candidate of the model's best is safe: untuned
        predicted.add(st.task.mod, trace_json, st.task.target, st.task.args_info)
        logger.debug("%s: predicted after %d replays", st.report.task_name, replays)
        st.report.predicted = True
        count += 1
    if done < len(order):
        logger.info("max_time reached after %d predicted schedules", count)
    return count
