"""The in-model profile (relax_tune.profile): every kernel the model calls, timed in place."""

import time

import numpy as np
import tvm
from tvm import relax

import relax_tune as rt
from relax_tune.profile import base_name, compare_with_tasks, profile_model
from relax_tune.testing.models import conv_net, model_inputs, split_inputs


def test_profile_times_every_kernel_of_the_model_in_place(target, tmp_path):
    mod, _ = conv_net(channels=16, size=16)
    arrays = model_inputs(mod)
    inputs, weights = split_inputs(mod, arrays)
    lowered = rt.transform.lower_for_tuning(mod, target, weights, cpu_weight_prepack=True)
    tasks = rt.extract_tasks(lowered, target)
    ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path), params=weights,
        max_trials_global=0))
    profile = profile_model(ex, inputs, "forward", runs=5)
    kernels = {base_name(k.name): k for k in profile}
    # every task is called as often per run as its call sites say
    for task in tasks:
        assert kernels[task.task_name].calls == task.weight, task.task_name
    assert all(k.secs > 0 for k in profile)
    assert profile == sorted(profile, key=lambda k: -k.secs)
    # the kernels' in-place times add up to about the whole run
    vm = relax.VirtualMachine(ex, tvm.cpu())
    args = [tvm.runtime.tensor(x) for x in inputs]
    vm["forward"](*args)
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        vm["forward"](*args)
        runs.append(time.perf_counter() - start)
    whole, summed = float(np.median(runs)), sum(k.secs for k in profile)
    assert 0.3 * whole < summed < 3 * whole
    rows = compare_with_tasks(profile, {tasks[0].task_name: 1e-3})
    (row,) = [r for r in rows if base_name(r[0]) == tasks[0].task_name]
    assert row[3] == 1e-3 * tasks[0].weight
    assert all(r[3] is None for r in rows if base_name(r[0]) != tasks[0].task_name)


def test_warm_profile_calls_each_kernel_again_and_leaves_builtins_alone(target, tmp_path):
    """``warm=True``: every kernel also has its time called again at once with the same
    arguments; the VM's builtins (allocation, ...) are not called twice."""
    mod, _ = conv_net(channels=16, size=16)
    arrays = model_inputs(mod)
    inputs, weights = split_inputs(mod, arrays)
    ex = tvm.compile(mod, target, relax_pipeline=relax.get_pipeline(
        "relax_tune", target=target, work_dir=str(tmp_path), params=weights,
        max_trials_global=0))
    profile = profile_model(ex, inputs, "forward", runs=3, warm=True)
    kernels = [k for k in profile if not k.name.startswith("vm.builtin")]
    assert kernels and all(k.warm_secs is not None and k.warm_secs > 0 for k in kernels)
    assert all(k.warm_secs is None for k in profile if k.name.startswith("vm.builtin"))
    assert all(k.warm_secs is None for k in profile_model(ex, inputs, "forward", runs=2))
