"""Models for the command line: an ONNX file, a ``torch.export`` archive, or a Python function
returning a Relax IRModule or a PyTorch model.

``load_model(spec)`` understands

- ``path/to/model.onnx``: imported with ``tvm.relax.frontend.onnx.from_onnx`` (the ``onnx``
  extra); the weights become constants of the module;
- ``path/to/model.pt2``: a ``torch.export.save`` archive, imported with
  ``tvm.relax.frontend.torch.from_exported_program`` (the ``torch`` extra); the weights
  become ``params`` and the function is ``main``;
- ``path/to/file.py:function`` or ``package.module:function``: ``function()`` returns an
  IRModule, or ``(IRModule, params)`` where params is ``{name: array}`` or a list of
  ``(name, parameter)`` pairs as ``nn.Module.export_tvm`` returns them; or a PyTorch model:
  a ``torch.export.ExportedProgram``, or ``(torch.nn.Module, example_inputs)``, exported with
  ``torch.export.export`` in eval mode and imported as a ``.pt2`` is.

PyTorch is imported only when a PyTorch model is loaded.

``LoadedModel.lowered(target)`` binds the params and runs the "relax_tune" pipeline's
pre-tuning passes (``lower_for_tuning``), so the tasks tuned from it are exactly the ones ``relax-tune compile``
(the pipeline) looks up in the database.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm import relax

from .qoperator import qoperator_as_qdq
from .utils import RelaxTuneError

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
    weights_bound: the weights are constants of ``mod`` already (an ONNX model), so they are
        packed at compile time like bound ``params`` (``cpu_weight_prepack``'s default).
    """

    mod: tvm.IRModule
    params: dict[str, np.ndarray] = field(default_factory=dict)
    source: str = ""
    weights_bound: bool = False

    def _params(self) -> dict[str, np.ndarray] | None:
        """``params`` for the pipeline: None when there are none to bind and the weights are
        not bound either (then they are function inputs, not packed)."""
        return dict(self.params) if self.params or self.weights_bound else None

    def lowered(self, target: Any = None, winograd: bool = True,
                int8: bool | str = "auto") -> tvm.IRModule:
        """The module with ``params`` bound, after the "relax_tune" pipeline's pre-tuning
        passes (``prepare.lower_for_tuning``, ``int8`` resolved as the pipeline resolves
        it): the module tasks are extracted from."""
        from .int8_choice import resolve_int8
        from .lowering.prepare import lower_for_tuning
        from .utils import parse_target

        target = parse_target(target)
        return lower_for_tuning(self.mod, target, self._params(), winograd=winograd,
                                int8=resolve_int8(int8, self.mod, target))

    def compile_lowered(self, lowered: tvm.IRModule, target: Any, work_dir: str,
                        shape_hints: Any = None) -> Any:
        """``lowered`` (what ``lowered(target)`` returned) compiled with the work_dir's
        schedules: the rest of the "relax_tune" pipeline (``pipeline.finish_passes``), as
        ``compile_pipeline`` compiles ``self.mod`` with nothing to tune, without lowering
        it again (4 s of EfficientNet-B0's compile)."""
        from .lowering import default_prepack
        from .pipeline import finish_passes
        from .utils import parse_target
        from .work_dir import WorkDir

        target = parse_target(target)  # tvm.compile runs the passes under it
        return tvm.compile(lowered, target, relax_pipeline=finish_passes(
            target, WorkDir.of(work_dir), default_prepack(target, self._params(), False),
            shape_hints=shape_hints))

    def compile_pipeline(self, target: Any, work_dir: str, **kwargs: Any) -> Any:
        """The "relax_tune" pipeline for this model with its ``params`` (so weights are
        bound and, on CPU, prepacked exactly as ``lowered`` prepared the tasks); compile
        ``self.mod`` with it."""
        return relax.get_pipeline("relax_tune", target=target, work_dir=work_dir,
                                  params=self._params(), **kwargs)


def load_model(spec: str, shape_dict: Mapping[str, list[int]] | None = None) -> LoadedModel:
    """Load the model named by ``spec`` (see the module docstring); ``shape_dict`` fixes the
    input shapes of an ONNX model with symbolic dimensions. Raise RelaxTuneError naming the spec
    and what to do when it cannot be loaded."""
    if not isinstance(spec, str) or not spec.strip():
        raise RelaxTuneError("no model given: pass an ONNX file (model.onnx), a torch.export "
                             "archive (model.pt2) or file.py:function returning a Relax "
                             "IRModule")
    spec = spec.strip()
    if spec.lower().endswith(".onnx"):
        return load_onnx(spec, shape_dict)
    if shape_dict:
        raise RelaxTuneError(f"--input-shape fixes the inputs of ONNX models only; {spec!r} is "
                             "not one: leave it out (give the shapes in the model itself)")
    if spec.lower().endswith(".pt2"):
        return load_torch_export(spec)
    path, sep, func_name = spec.rpartition(":")
    if not sep or not path or not func_name:
        raise RelaxTuneError(
            f"model {spec!r} is neither an ONNX file (*.onnx), a torch.export archive (*.pt2) "
            "nor file.py:function / module:function naming a function that returns a Relax "
            "IRModule")
    return load_python(path, func_name, spec)


def load_onnx(path: str, shape_dict: Mapping[str, list[int]] | None = None) -> LoadedModel:
    """Import an ONNX file with ``tvm.relax.frontend.onnx`` (weights bound as constants)."""
    _check_model_file(path, "ONNX model")
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
    if not model.graph.node and not model.ir_version:
        raise RelaxTuneError(f"{path!r} is not an ONNX model (no graph, no IR version): save "
                             "one with torch.onnx.export or onnx.save")
    _check_input_names(model, path, shape_dict)
    try:  # ONNX Runtime's QOperator format, which TVM's importer does not read
        model, _ = qoperator_as_qdq(model)
    except Exception as err:  # noqa: BLE001 - a malformed node: the importer names it below
        logger.warning("QOperator nodes of %r left as they are (%s)", path, _first_line(err))
    try:
        mod = from_onnx(model, shape_dict=dict(shape_dict) if shape_dict else None)
    except Exception as err:  # unsupported operators, bad shapes, ...
        raise RelaxTuneError(f"TVM's ONNX importer rejected {path!r}: {_first_line(err)}"
                             " (symbolic input shapes can be fixed with --input-shape)") \
            from None
    return LoadedModel(_check_module(mod, path), {}, path, weights_bound=True)


def load_torch_export(path: str) -> LoadedModel:
    """Load a ``torch.export.save`` archive (``model.pt2``) and import it with
    ``from_torch``."""
    _check_model_file(path, "PyTorch model")
    torch = _import_torch(path)
    # torch logs the real error with a traceback, then raises a vaguer one: keep the former
    with _log_errors_caught("torch.export") as logged:
        try:
            program = torch.export.load(path)
        except Exception as err:  # not a zip, no exported program inside, version mismatch
            cause = _first_line(logged[0] if logged else err)
            raise RelaxTuneError(f"{path!r} is not a torch.export archive: save one with "
                                 "torch.export.save(torch.export.export(model, inputs), "
                                 f"'model.pt2') ({cause})") from None
    return from_torch(program, path)


def from_torch(model: Any, source: str = "", example_inputs: Any = None) -> LoadedModel:
    """Import a PyTorch model into Relax: a ``torch.export.ExportedProgram``, or a
    ``torch.nn.Module`` with ``example_inputs`` (a tensor or a tuple of them), which is put
    in eval mode and exported with ``torch.export.export``. The weights become ``params``
    (``{name: numpy array}``) of the Relax function ``main``, whose first parameters are the
    model's inputs; a single output is returned as a tensor, not a 1-tuple."""
    source = source or type(model).__name__
    torch = _import_torch(source)
    if isinstance(model, torch.nn.Module):
        if isinstance(example_inputs, torch.Tensor):
            example_inputs = (example_inputs,)
        if not isinstance(example_inputs, (tuple, list)):
            raise RelaxTuneError(f"{source}: a torch.nn.Module needs example inputs to export "
                                 "it: return (module, (tensor, ...)), not (module, "
                                 f"{type(example_inputs).__name__})")
        try:
            model = torch.export.export(model.eval(), tuple(example_inputs))
        except Exception as err:
            raise RelaxTuneError(f"{source}: torch.export.export failed on the module: "
                                 f"{_first_line(err)}") from None
    if not isinstance(model, torch.export.ExportedProgram):
        raise RelaxTuneError(f"{source}: expected a torch.export.ExportedProgram or a "
                             f"torch.nn.Module, not {type(model).__name__}")
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    try:
        with warnings.catch_warnings():  # TVM's importer on torch 2.13: not the user's concern
            warnings.filterwarnings("ignore", ".*LeafSpec.* is deprecated", FutureWarning)
            mod = from_exported_program(model, keep_params_as_input=True,
                                        unwrap_unit_return_tuple=True)
    except Exception as err:  # an operator the importer does not know, ...
        raise RelaxTuneError(f"TVM's PyTorch importer rejected {source!r}: "
                             f"{_first_line(err)}") from None
    mod, weights = detach_params(mod)
    params: dict[str, np.ndarray] = {}
    for name, arrays in weights.items():
        func = mod[name]
        num_input = int(func.attrs["num_input"])
        for var, array in zip(func.params[num_input:], arrays, strict=True):
            params[var.name] = array.numpy()
    return LoadedModel(_check_module(mod, source), params, source)


def load_python(path: str, func_name: str, spec: str | None = None) -> LoadedModel:
    """Call ``func_name`` from the Python file ``path`` (or importable module ``path``) and
    wrap what it returns: an IRModule, ``(IRModule, params)``, a
    ``torch.export.ExportedProgram`` or ``(torch.nn.Module, example_inputs)``."""
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
    try:
        result = func()
    except Exception as err:  # the user's function failed: say where, not how TVM saw it
        raise RelaxTuneError(f"model function {spec} raised {type(err).__name__}: "
                             f"{_first_line(err)}; fix it so that it returns the model") \
            from None
    params: Any = None
    if isinstance(result, tuple):
        if len(result) != 2:
            raise RelaxTuneError(f"{spec} returned a tuple of {len(result)} values; "
                                 f"{_EXPECTED}")
        result, params = result
    if _is_torch_model(result):
        return from_torch(result, spec, example_inputs=params)
    return LoadedModel(_check_module(result, spec), _params_dict(params, spec), spec)


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


def _check_model_file(path: str, what: str) -> None:
    """RelaxTuneError unless ``path`` is a readable, non-empty file."""
    if os.path.isdir(path):
        raise RelaxTuneError(f"{what} {path!r} is a folder, not a file: give the model file")
    if not os.path.isfile(path):
        raise RelaxTuneError(f"{what} {path!r} does not exist: check the path")
    if os.path.getsize(path) == 0:
        raise RelaxTuneError(f"{what} {path!r} is an empty file: export the model again")


def _check_input_names(model: Any, path: str, shape_dict: Mapping | None) -> None:
    """Every ``--input-shape`` name must be an input of the ONNX graph (a misspelt one would
    be dropped without a word, and symbolic shapes tuned instead)."""
    if not shape_dict:
        return
    inits = {init.name for init in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in inits]
    unknown = [name for name in shape_dict if name not in inputs]
    if unknown:
        raise RelaxTuneError(f"--input-shape names {', '.join(map(repr, unknown))}, which "
                             f"{'is' if len(unknown) == 1 else 'are'} not an input of {path!r}; "
                             f"its inputs: {', '.join(inputs) or 'none'}")


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
        except ModuleNotFoundError as err:
            if err.name == "torch":
                raise RelaxTuneError(f"{path!r} imports torch, which is not installed: "
                                     "pip install 'relax_tune[torch]'") from None
            raise RelaxTuneError(f"{path!r} imports {err.name!r}, which is not installed "
                                 f"(model {spec!r})") from None
        except SyntaxError as err:
            raise RelaxTuneError(f"{path!r}, line {err.lineno}: {err.msg} (model {spec!r}): "
                                 "fix the file") from None
        except Exception as err:  # the file raised while it was imported
            raise RelaxTuneError(f"importing {path!r} raised {type(err).__name__}: "
                                 f"{_first_line(err)} (model {spec!r}): fix the file") \
                from None
        finally:
            sys.path.pop(0)
        return module
    try:
        return importlib.import_module(path)
    except ImportError as err:
        raise RelaxTuneError(f"cannot import module {path!r} of model {spec!r} ({err}); give "
                             "a file.py:function path or an importable module") from None
    except Exception as err:  # the module raised while it was imported
        raise RelaxTuneError(f"importing module {path!r} raised {type(err).__name__}: "
                             f"{_first_line(err)} (model {spec!r})") from None


_EXPECTED = ("return a tvm.IRModule, (IRModule, params), a torch.export.ExportedProgram or "
             "(torch.nn.Module, example_inputs)")


class _CaughtErrors(logging.Handler):
    """Collects the exceptions of the log records it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.errors.append(record.exc_info[1])


@contextlib.contextmanager
def _log_errors_caught(name: str):
    """Logger ``name`` prints nothing inside; yields the exceptions its records carried."""
    log = logging.getLogger(name)
    caught = _CaughtErrors()
    saved = log.handlers, log.propagate
    log.handlers, log.propagate = [caught], False
    try:
        yield caught.errors
    finally:
        log.handlers, log.propagate = saved


def _import_torch(source: str):
    try:
        import torch
    except ImportError:
        raise RelaxTuneError(f"loading {source!r} needs PyTorch: "
                             "pip install 'relax_tune[torch]'") from None
    return torch


def _is_torch_model(obj: Any) -> bool:
    """Whether ``obj`` is a ``torch.nn.Module`` or ``torch.export.ExportedProgram``, without
    importing torch (a function returned one, so torch is imported already if it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, (torch.nn.Module,
                                                  torch.export.ExportedProgram))


def _check_module(mod: Any, spec: str) -> tvm.IRModule:
    if not isinstance(mod, tvm.IRModule):
        raise RelaxTuneError(f"{spec} gave a {type(mod).__name__}; {_EXPECTED}")
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
