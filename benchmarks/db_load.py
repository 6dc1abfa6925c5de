"""Write a 100k-record JSON database (10 matmul workloads, replay-search traces) once into DIR and time loading it.

    python -m benchmarks.db_load DIR   (N=100000 by default; set N in the environment)
"""
import os, sys, time, json, tempfile, random
from tvm import te
from relax_tune import utils
from relax_tune.database import JSONDatabase, TuningRecord
from relax_tune.search import make_search

def mm(n):
    A = te.placeholder((n, n), "float32", name="A"); B = te.placeholder((n, n), "float32", name="B")
    k = te.reduce_axis((0, n), name="k")
    return utils.normalize_mod(te.create_prim_func([A, B, te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")]))
target = utils.host_target()
work = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
N = int(os.environ.get("N", 100000))
if not os.path.exists(os.path.join(work, "database_tuning_record.json")) or os.path.getsize(os.path.join(work, "database_tuning_record.json")) == 0:
    db = JSONDatabase(work_dir=work)
    mods = [mm(16 * (i + 1)) for i in range(10)]
    wls = [db.commit_workload(m) for m in mods]
    cands = {i: make_search("replay", m, target, seed=1).next_candidates(50) for i, m in enumerate(mods)}
    rng = random.Random(0)
    lines = []
    cfg = utils.target_config(target) if hasattr(utils, "target_config") else None
    for r in range(N):
        i = r % 10
        c = cands[i][r // 10 % len(cands[i])]
        rec = TuningRecord(c.trace_json, wls[i], [rng.random() * 1e-3] * 3, target, utils.args_info(mods[i]))
        lines.append(json.dumps([i, rec.as_json()], separators=(",", ":")))
    with open(os.path.join(work, "database_tuning_record.json"), "w") as f:
        f.write("\n".join(lines) + "\n")
size = os.path.getsize(os.path.join(work, "database_tuning_record.json"))
t = time.perf_counter()
db = JSONDatabase(work_dir=work)
dt = time.perf_counter() - t
print(f"records={len(db)} file={size/1e6:.1f} MB load={dt:.2f} s")
t = time.perf_counter(); wl = db.get_all_workloads(); top = [db.get_top_k(w, 1) for w in wl]; print(f"top-1 of {len(wl)} workloads: {time.perf_counter()-t:.3f} s")
