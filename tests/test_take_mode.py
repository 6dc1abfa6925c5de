"""Every ``take`` in "clip" mode (lowering/take_mode.py): an embedding lookup compiles with no
TOPI warning, reads the right rows, and an id past the table reads its last row."""

import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R

import relax_tune as rt
from relax_tune.lowering.take_mode import ClippedTakes


def _embedding(mode: str = "fast") -> tvm.IRModule:
    bb = relax.BlockBuilder()
    ids = relax.Var("ids", R.Tensor((1, 8), "int64"))
    table = relax.Var("table", R.Tensor((50, 16), "float32"))
    with bb.function("main", [ids, table]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.take(table, ids, axis=0, mode=mode))
        bb.emit_func_output(out)
    return bb.get()


def _modes(mod: tvm.IRModule) -> list[str]:
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and expr.op.same_as(tvm.ir.Op.get("relax.take")):
            found.append(str(expr.attrs.mode))

    relax.analysis.post_order_visit(mod["main"], visit)
    return found


def test_fast_takes_become_clipped_and_others_stay():
    assert _modes(ClippedTakes()(_embedding("fast"))) == ["clip"]
    assert _modes(ClippedTakes()(_embedding("wrap"))) == ["wrap"]


def test_an_embedding_compiles_quietly_and_clips_ids_past_the_table(tmp_path, capfd):
    target = rt.host_target()
    pipeline = relax.get_pipeline("relax_tune", target=target, work_dir=str(tmp_path / "wd"),
                                  measure=False)
    capfd.readouterr()
    ex = tvm.compile(_embedding(), target, relax_pipeline=pipeline)
    assert "Fast mode segfaults" not in capfd.readouterr().err
    vm = relax.VirtualMachine(ex, tvm.cpu())
    table = np.random.default_rng(0).standard_normal((50, 16)).astype("float32")
    ids = np.array([[0, 3, 49, 7, 57, 1, 2, 9]], "int64")  # 57: past the table's 50 rows
    got = vm["main"](tvm.runtime.tensor(ids), tvm.runtime.tensor(table)).numpy()
    np.testing.assert_array_equal(got, table[np.minimum(ids, 49)])
