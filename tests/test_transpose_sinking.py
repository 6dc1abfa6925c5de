"""Transposes moved down the graph until they cancel (lowering/transpose_sinking.py)."""

import numpy as np
import tvm
from tvm import relax

from relax_tune.lowering.rewrite import count_calls
from relax_tune.lowering.transpose_sinking import sink_transposes

from model_checks import run_zero_pipeline

NCHW, NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


def count_transposes(mod: tvm.IRModule) -> int:
    return count_calls(mod, "relax.permute_dims")


def _function(body) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 6, 5, 8), "float32"))  # NHWC
    r = relax.Var("r", relax.TensorType((1, 8, 3, 2), "float32"))  # NCHW, for a residual
    with bb.function("main", [x, r]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x, r))
        bb.emit_func_output(out)
    return bb.get()


def _quantized_block(bb, x, r):
    """A quantized layer's tail as ConvertLayout leaves it: back to NCHW, clip, cast, the
    zero-point pad, a pool, a dequantize, a residual add, back to NHWC."""
    t = bb.emit(relax.op.permute_dims(x, NCHW))
    c = bb.emit(relax.op.astype(relax.op.clip(relax.op.round(t), 0, 255), "uint8"))
    p = bb.emit(relax.op.nn.pad(c, [0, 0, 0, 0, 1, 1, 1, 1], pad_value=3.0))
    pooled = bb.emit(relax.op.nn.max_pool2d(relax.op.astype(p, "float32"), (3, 3), (2, 2)))
    d = bb.emit(relax.op.add(pooled, r))
    return bb.emit(relax.op.permute_dims(relax.op.multiply(d, relax.const(0.5)), NHWC))


def test_transposes_around_unknown_elementwise_ops_pad_and_pools_cancel():
    r_nhwc = np.random.default_rng(1).standard_normal((1, 3, 3, 8)).astype("float32")

    def with_residual_nhwc(bb, x, _r):  # the residual also comes transposed from NHWC
        r = bb.emit(relax.op.permute_dims(relax.const(r_nhwc), NCHW))
        return _quantized_block(bb, x, r)

    mod = _function(with_residual_nhwc)
    assert count_transposes(mod) == 3
    out = sink_transposes(mod)
    assert count_transposes(out) == 0
    x = np.random.default_rng(0).uniform(-20, 300, (1, 6, 5, 8)).astype("float32")
    unused = np.zeros((1, 8, 3, 2), "float32")
    np.testing.assert_allclose(run_zero_pipeline(out, x, unused), run_zero_pipeline(mod, x, unused), rtol=1e-6)


def _assert_all_cancel(mod: tvm.IRModule, before: int) -> None:
    """``mod`` has ``before`` transposes, none after sinking, and computes the same."""
    out = sink_transposes(mod)
    assert count_transposes(mod) == before and count_transposes(out) == 0
    x = np.random.default_rng(0).standard_normal((1, 6, 5, 8)).astype("float32")
    unused = np.zeros((1, 8, 3, 2), "float32")
    np.testing.assert_allclose(run_zero_pipeline(out, x, unused), run_zero_pipeline(mod, x, unused), rtol=1e-6)


def test_a_global_average_pool_over_nchw_reads_the_nhwc_tensor():
    """MobileNetV2's head as ConvertLayout leaves it: the NHWC tensor back to NCHW, a mean
    over H and W keeping them, flattened. The mean moves onto the NHWC tensor; the
    transpose left after it moves only axes of extent 1 and becomes a reshape."""
    def head(bb, x, _r):
        t = bb.emit(relax.op.permute_dims(x, NCHW))
        pooled = bb.emit(relax.op.mean(t, [2, 3], keepdims=True))
        return bb.emit(relax.op.reshape(pooled, [1, 8]))

    _assert_all_cancel(_function(head), before=1)


def test_a_reduction_that_drops_an_axis_keeps_the_others_in_order():
    """A max over NCHW's W, dropping it, leaves (N, C, H); the NHWC tensor's max over W
    leaves (N, H, C), so a transpose swaps the two back, and cancels the one after it."""
    def block(bb, x, _r):
        t = bb.emit(relax.op.permute_dims(x, NCHW))
        reduced = bb.emit(relax.op.max(t, [3], keepdims=False))
        return bb.emit(relax.op.permute_dims(reduced, [0, 2, 1]))

    _assert_all_cancel(_function(block), before=2)


def test_a_rewrite_that_leaves_as_many_transposes_is_not_kept():
    def block(bb, x, r):  # the add's other side stays NCHW: nothing can cancel
        t = bb.emit(relax.op.permute_dims(x, NCHW))
        return bb.emit(relax.op.add(relax.op.nn.relu(t), relax.op.nn.relu(t)))

    mod = _function(block)
    assert sink_transposes(mod) is mod


def test_a_channel_shuffle_between_concat_and_split_stays_channels_last():
    """ShuffleNetV2's block as ConvertLayout leaves it: two NHWC branches back to NCHW,
    concatenated, shuffled (channels reshaped into 2 groups, the groups transposed, reshaped
    back), split in two, each half back to NHWC. Every transpose cancels."""

    def block(bb, x, _r):
        a = bb.emit(relax.op.permute_dims(x, NCHW))
        b = bb.emit(relax.op.permute_dims(relax.op.nn.relu(x), NCHW))
        c = bb.emit(relax.op.concat([a, b], axis=1))  # 1 x 16 x 6 x 5
        g = bb.emit(relax.op.reshape(c, [1, 2, 8, 6, 5]))
        s = bb.emit(relax.op.reshape(relax.op.permute_dims(g, [0, 2, 1, 3, 4]), [1, 16, 6, 5]))
        halves = bb.emit(relax.op.split(s, 2, axis=1))
        first = bb.emit(relax.op.permute_dims(relax.TupleGetItem(halves, 0), NHWC))
        second = bb.emit(relax.op.permute_dims(relax.TupleGetItem(halves, 1), NHWC))
        return bb.emit(relax.op.subtract(first, second))

    mod = _function(block)
    assert count_transposes(mod) == 5
    out = sink_transposes(mod)
    assert count_transposes(out) == 1  # the shuffle's own transpose of the groups
    x = np.random.default_rng(0).standard_normal((1, 6, 5, 8)).astype("float32")
    unused = np.zeros((1, 8, 3, 2), "float32")
    np.testing.assert_allclose(run_zero_pipeline(out, x, unused), run_zero_pipeline(mod, x, unused), rtol=1e-6)


def test_a_table_lookup_and_a_squeeze_and_excite_gate_stay_channels_last():
    """An int8 EfficientNet block's tail as ConvertLayout leaves it: the NHWC tensor back to
    NCHW, looked up in a 1-D table (``int8_tables``), times a gate of shape (1, C, 1, 1)
    (which is (1, 1, 1, C) under NHWC: a reshape, no data moved), back to NHWC. Both
    transposes cancel; a gate whose long axes would change order under the permutation
    (here (1, C, H, 1)) is not reshaped, so its transposes stay."""
    table = np.arange(256, dtype="float32")[::-1].copy()
    gate = np.random.default_rng(2).standard_normal((1, 8, 1, 1)).astype("float32")

    def block(bb, x, _r, gate=gate):
        t = bb.emit(relax.op.permute_dims(x, NCHW))
        index = bb.emit(relax.op.astype(relax.op.clip(t, 0, 255), "int32"))
        looked = bb.emit(relax.op.take(relax.const(table), index, axis=0))
        gated = bb.emit(relax.op.multiply(looked, relax.const(gate)))
        return bb.emit(relax.op.permute_dims(gated, NHWC))

    _assert_all_cancel(_function(block), before=2)
    wide = np.ones((1, 8, 6, 1), "float32")
    mod = _function(lambda bb, x, r: block(bb, x, r, gate=wide))
    assert count_transposes(sink_transposes(mod)) > 0
