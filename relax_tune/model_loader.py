"""Models for the command line: an ONNX file, or a Python function returning a Relax IRModule.

``load_model(spec)`` understands

- ``path/to/model.onnx``: imported with ``tvm.relax.frontend.onnx.from_onnx`` (the ``onnx``
  extra); the weights become constants of the module;
- ``path/to/file.py:function`` or ``package.module:function``: ``function()`` returns an
  IRModule, or ``(IRModule, params)`` where params is ``{name: array}`` or a list of
  ``(name, parameter)`` pairs as ``nn.Module.export_tvm`` returns them.

``LoadedModel.lowered(target)`` binds the params and runs the "relax_tune" pipeline's
pre-tuning passes (``lower_for_tuning``), so the tasks tuned from it are exactly the ones ``relax-tune compile``
(the pipeline) looks up in the database.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .utils import RelaxTuneError, parse_target

logger = logging.getLogger("relax_tune.model_loader")


@dataclass
class LoadedModel:
    """A Relax model ready to tune or compile.

    Attributes
    ----------
    mod: the Relax IRModule as loaded (not lowered).
    params: ``{name: numpy array}`` bound into the Relax functions before lowering (parameters
        without values stay function inputs).
    source: the spec it was loaded from.
    """

    mod: tvm.IRModule
    params: dict[str, np.ndarray] = field(default_factory=dict)
    source: str = ""

    def bound(self) -> tvm.IRModule:
        """The module with ``params`` bound as constants (what is tuned and compiled)."""
        return bind_params(self.mod, self.params)

    def lowered(self, target: Any = None) -> tvm.IRModule:
        """The bound module after the "relax_tune" pipeline's pre-tuning passes (legalized,
        fused, FuseTIR): the module tasks are extracted from."""
        return lower_for_tuning(self.bound(), target, weights_bound=bool(self.params))

    def compile_pipeline(self, target: Any, work_dir: str, **kwargs: Any) -> Any:
        """The "relax_tune" pipeline for this model with its ``params`` (so weights are
        bound and, on CPU, prepacked exactly as ``lowered`` prepared the tasks); compile
        ``self.mod`` with it."""
        return relax.get_pipeline("relax_tune", target=target, work_dir=work_dir,
                                  params=self.params or None, **kwargs)


def lower_for_tuning(mod: tvm.IRModule, target: Any = None,
                     weights_bound: bool = False) -> tvm.IRModule:
    """``mod`` through the passes the "relax_tune" pipeline runs before it tunes
    (``transform.lowering_passes``), so the tasks extracted from the result are the
    functions the pipeline later looks up in the database. ``weights_bound``: ``mod`` has
    the model's params bound, as the pipeline's ``params`` does, so on CPU the weights are
    marked layout-free (the pipeline's default ``cpu_weight_prepack``)."""
    from .transform import lowering_passes

    target = parse_target(target)
    prepack = weights_bound and target.kind.name == "llvm"
    with target:
        return tvm.transform.Sequential(lowering_passes(target, cpu_weight_prepack=prepack))(mod)


def load_model(spec: str, shape_dict: Mapping[str, list[int]] | None = None) -> LoadedModel:
    """Load the model named by ``spec`` (see the module docstring); ``shape_dict`` fixes the
    input shapes of an ONNX model with symbolic dimensions. Raise RelaxTuneError naming the spec
    and what to do when it cannot be loaded."""
    if not isinstance(spec, str) or not spec.strip():
        raise RelaxTuneError("no model given: pass an ONNX file (model.onnx) or "
                             "file.py:function returning a Relax IRModule")
    spec = spec.strip()
    if spec.lower().endswith(".onnx"):
        return load_onnx(spec, shape_dict)
    path, sep, func_name = spec.rpartition(":")
    if not sep or not path or not func_name:
        raise RelaxTuneError(
            f"model {spec!r} is neither an ONNX file (*.onnx) nor file.py:function / "
            "module:function naming a function that returns a Relax IRModule")
    return load_python(path, func_name, spec)


def load_onnx(path: str, shape_dict: Mapping[str, list[int]] | None = None) -> LoadedModel:
    """Import an ONNX file with ``tvm.relax.frontend.onnx`` (weights bound as constants)."""
    if not os.path.isfile(path):
        raise RelaxTuneError(f"ONNX model {path!r} does not exist: check the path")
    try:
        import onnx
    except ImportError:
        raise RelaxTuneError(f"loading {path!r} needs the onnx package: "
                             "pip install 'relax_tune[onnx]'") from None
    from tvm.relax.frontend.onnx import from_onnx

    try:
        model = onnx.load(path)
    except Exception as err:  # protobuf DecodeError, OSError, ...
        raise RelaxTuneError(f"{path!r} is not a readable ONNX model ({_first_line(err)})") \
            from None
    try:
        mod = from_onnx(model, shape_dict=dict(shape_dict) if shape_dict else None)
    except Exception as err:  # unsupported operators, bad shapes, ...
        raise RelaxTuneError(f"TVM's ONNX importer rejected {path!r}: {_first_line(err)}"
                             " (symbolic input shapes can be fixed with --input-shape)") \
            from None
    return LoadedModel(_check_module(mod, path), {}, path)


def load_python(path: str, func_name: str, spec: str | None = None) -> LoadedModel:
    """Call ``func_name`` from the Python file ``path`` (or importable module ``path``) and
    wrap what it returns: an IRModule, or ``(IRModule, params)``."""
    spec = spec or f"{path}:{func_name}"
    module = _import(path, spec)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise RelaxTuneError(f"{path!r} has no function {func_name!r} (model {spec!r})")
    try:
        inspect.signature(func).bind()
    except TypeError:
        raise RelaxTuneError(f"{spec}: the function must be callable without arguments; wrap "
                             "it in one that passes them") from None
    except ValueError:  # no signature (a builtin): just call it
        pass
    result = func()
    params: Any = None
    if isinstance(result, tuple):
        if len(result) != 2:
            raise RelaxTuneError(f"{spec} returned a tuple of {len(result)} values; return an "
                                 "IRModule or (IRModule, params)")
        result, params = result
    return LoadedModel(_check_module(result, spec), _params_dict(params, spec), spec)


def bind_params(mod: tvm.IRModule, params: Mapping[str, Any]) -> tvm.IRModule:
    """Bind ``params`` as constants the way the "relax_tune" pipeline does
    (``transform.bind_params``); nothing to do for an empty dict."""
    if not params:
        return mod
    from .transform import bind_params as pipeline_bind

    return pipeline_bind(mod, dict(params))


def parse_shape_dict(items: list[str] | None) -> dict[str, list[int]]:
    """``["x=1,784", "y=2,3"]`` -> ``{"x": [1, 784], "y": [2, 3]}`` (``--input-shape``)."""
    out: dict[str, list[int]] = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        try:
            shape = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
        except ValueError:
            shape = []
        if not sep or not name or not shape:
            raise RelaxTuneError(f"--input-shape {item!r}: write NAME=D0,D1,... e.g. x=1,784")
        out[name] = shape
    return out


def _import(path: str, spec: str):
    if path.endswith(".py"):
        if not os.path.isfile(path):
            raise RelaxTuneError(f"Python file {path!r} does not exist (model {spec!r})")
        name = "_relax_tune_model_" + os.path.splitext(os.path.basename(path))[0]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise RelaxTuneError(f"cannot import {path!r} (model {spec!r})")
        module = importlib.util.module_from_spec(module_spec)
        # the file's own directory first, so it can import its neighbours
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        try:
            module_spec.loader.exec_module(module)
        finally:
            sys.path.pop(0)
        return module
    try:
        return importlib.import_module(path)
    except ImportError as err:
        raise RelaxTuneError(f"cannot import module {path!r} of model {spec!r} ({err}); give "
                             "a file.py:function path or an importable module") from None


def _check_module(mod: Any, spec: str) -> tvm.IRModule:
    if not isinstance(mod, tvm.IRModule):
        raise RelaxTuneError(f"{spec} gave a {type(mod).__name__}, not a tvm.IRModule")
    if not any(isinstance(f, relax.Function) for _, f in mod.functions.items()):
        raise RelaxTuneError(f"{spec} gave an IRModule without Relax functions; tune TIR-only "
                             "modules with relax_tune.tune_tir")
    return mod


def _params_dict(params: Any, spec: str) -> dict[str, np.ndarray]:
    """``{name: array}`` from a dict or ``export_tvm``'s ``[(name, nn.Parameter)]`` list;
    parameters without data are left as function inputs."""
    if params is None:
        return {}
    if isinstance(params, Mapping):
        items = list(params.items())
    elif isinstance(params, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 for p in params):
        items = list(params)
    else:
        raise RelaxTuneError(f"{spec}: params must be a dict {{name: array}} or a list of "
                             f"(name, array) pairs, not {type(params).__name__}")
    out: dict[str, np.ndarray] = {}
    for name, value in items:
        data = getattr(value, "data", value)  # nn.Parameter keeps its tensor in .data
        if data is None:
            continue
        if hasattr(data, "numpy"):
            data = data.numpy()
        out[str(name)] = np.asarray(data)
    return out


def _first_line(err: BaseException) -> str:
    lines = [line for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
