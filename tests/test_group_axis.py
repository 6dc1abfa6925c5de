"""SplitGroupAxis: a grouped convolution's output channel split into (group, channel within
it), tiled so that every candidate computes what the convolution does."""

import numpy as np
import pytest
import tvm
from tvm import relax

import relax_tune as rt
from relax_tune.lowering.prepare import lower_for_tuning
from relax_tune.space import generate_design_space, space_for_target, without_decisions
from relax_tune.space.analysis import collect_blocks
from relax_tune.space.params import ANN_WHOLE_LOOP
from relax_tune.testing.int8_kernels import kernel_args
from relax_tune.transform import extract_tasks


def _grouped_conv_task(channels: int, groups: int, size: int, target) -> tvm.IRModule:
    rng = np.random.default_rng(0)
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.const(rng.random((channels, channels // groups, 3, 3)).astype("float32"))
    bias = relax.const(rng.random((1, channels, 1, 1)).astype("float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1], groups=groups)
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(conv, bias)))
        bb.emit_func_output(out)
    lowered = lower_for_tuning(bb.get(), target)
    (task,) = [t for t in extract_tasks(lowered, target) if "conv2d" in t.task_name]
    return task.mod


def _run(mod, target, args):
    args = [tvm.runtime.tensor(a.numpy()) for a in args]
    tvm.compile(mod, target=target)["main"](*args)
    return args[-1].numpy()


UNROLL_PRAGMAS = ("pragma_auto_unroll_max_step", "pragma_unroll_explicit")


def _without_unroll(sch) -> tvm.IRModule:
    """The candidate's module without its unroll pragmas: unrolling changes no value a tile
    writes, and a candidate's 512-step explicit unroll of a 48-channel group took 27-31 s of
    LLVM each on AVX-512 (AMD EPYC Zen 4; the [96-2] case ran 191 s, 7 s on a Zen 3)."""
    sch = sch.copy()
    for block in collect_blocks(sch):
        for loop in sch.get_loops(block):
            for key in UNROLL_PRAGMAS:
                if key in sch.get(loop).annotations:
                    sch.unannotate(loop, key)
    return sch.mod


@pytest.mark.parametrize("channels,groups", [(64, 8), (96, 2)])  # 8 and 48 a group
def test_every_candidate_of_a_grouped_convolution_is_correct(channels, groups):
    """Tiles of part of the channels within a group and of several groups wrote channels
    with gaps between them, and the fused bias and ReLU computed under such a tile read
    channels no job had written yet: 5 of 7 and 4 of 19 random candidates of these two were
    wrong before the channel within the group was kept whole above the write-back."""
    target = rt.host_target()
    mod = _grouped_conv_task(channels, groups, 14, target)
    args = kernel_args(mod)
    ref = _run(mod, target, args)
    space = space_for_target(target)
    sketches = generate_design_space(mod, target)
    assert any(ANN_WHOLE_LOOP in str(inst.attrs) for s in sketches for inst in s.insts)
    checked = 0
    for sketch in sketches:
        for seed in range(1, 7):  # TVM's seeds start at 1 (0: a random one)
            candidate = space.replay(mod, without_decisions(sketch), seed=seed)
            if candidate.error is None:
                np.testing.assert_allclose(_run(_without_unroll(candidate.sch), target, args), ref,
                                           rtol=1e-5, atol=1e-4)
                checked += 1
    # which samples the register-tile check keeps depends on the CPU (6 and 9 of 18 on a
    # Zen 1, the same under any PYTHONHASHSEED; seed 0 was a random one, so the count once
    # moved from process to process; more seeds reach slow builds): at least 2
    assert checked >= 2
