"""Vectorisable float32 ``exp``, ``erf``, ``tanh`` and ``sigmoid`` for CPU kernels.

LLVM has no vector form of these functions: a vectorised ``exp`` becomes one libm call per
lane, and TVM's ``erf`` lowering is slower still (measured: docs/design/fast-math.md). They sit
in the softmax, GELU, SiLU and sigmoid of every transformer and many CNNs, and no schedule can
make a scalar call vectorise. ONNX Runtime (MLAS) and PyTorch (Sleef) evaluate them with
polynomial approximations in vector registers; ``FastMath`` rewrites every float32 call in the
module's PrimFuncs into such arithmetic before tuning, so the tasks are tuned and applied with
it:

- ``exp``: Cephes' ``expf`` (range reduction by ln 2 in two parts, degree-5 polynomial,
  2^n built in the exponent bits); inputs clamped to [-88.38, 88.38] (exp(-inf) = 0).
- ``erf``, ``tanh``: Eigen's rational approximations (the ones TVM's ``topi.fast_erf`` and
  ``fast_tanh`` use), inputs clamped to [-4, 4] and [-9, 9].
- ``sigmoid``: Eigen's rational approximation of the logistic function (the one ONNX
  Runtime's MLAS uses): ``0.5 + x * P(x^2) / Q(x^2)`` on x clamped to [-18, 18], about half
  the operations of ``1 / (1 + exp(-x))`` and no integer steps (a SiLU over 56x56x144
  floats: 420 -> 325 us, AMD Zen 1, 2 threads). Its error is absolute, up to 1e-7 (two ulps
  of 1.0), so outputs far below 0.5 (x < -5) are not accurate to their own ulps; as an
  activation (SiLU, squeeze-and-excite gates) that is below float32 rounding of the values
  it scales.

``exp``, ``erf`` and ``tanh`` agree with libm to a few float32 ulps (tested in
tests/test_fast_math.py).

``nearbyint`` (Relax's ``round``: every int8 requantisation) becomes ``round``: both are
``llvm.nearbyint`` (half to even) on CPUs, but TVM's vectorizer leaves a loop with a
``nearbyint`` call scalar.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

F32 = "float32"

_EXP_P = [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
          1.6666665459e-1, 5.0000001201e-1]
_ERF_ALPHA = [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
              -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
              -1.60960333262415e-02]
_ERF_BETA = [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
             -7.37332916720468e-03, -1.42647390514189e-02]
_TANH_ALPHA = [-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
               5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
               4.89352455891786e-03]
_TANH_BETA = [1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
              4.89352518554385e-03]
_LOGISTIC_ALPHA = [4.37031012579801e-11, 1.15627324459942e-07, 6.08574864600143e-05,
                   8.51377133304701e-03, 2.48287947061529e-01]
_LOGISTIC_BETA = [6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
                  1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01]


def _c(value: float) -> tirx.PrimExpr:
    return tirx.const(value, F32)


def _horner(x: tirx.PrimExpr, coeffs: list[float]) -> tirx.PrimExpr:
    """coeffs[0] * x^(n-1) + ... + coeffs[-1]."""
    out = _c(coeffs[0])
    for c in coeffs[1:]:
        out = out * x + _c(c)
    return out


def _clamp(x: tirx.PrimExpr, lo: float, hi: float) -> tirx.PrimExpr:
    return tirx.max(tirx.min(x, _c(hi)), _c(lo))


def fast_exp(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 e^x as vectorisable arithmetic (Cephes expf).

    Temporaries are written out at every use, not bound by a ``Let``: alone, on 197x768, the
    compiler shares only part of the repeated pure subexpressions (2x the time of the
    ``Let`` form, still far faster than libm), but in the models' fused kernels the ``Let``
    form measured no faster, and it would change every workload with an exp (the shipped
    library's records are keyed by workload): docs/design/fast-math.md."""
    xc = _clamp(x, -88.3762626647949, 88.3762626647949)
    n = tirx.floor(xc * _c(1.44269504088896341) + _c(0.5))
    r = xc - n * _c(0.693359375) + n * _c(2.12194440e-4)  # x - n ln2, ln2 in two parts
    pow2n = tirx.reinterpret(F32, tirx.shift_left(
        tirx.Cast("int32", n) + tirx.const(127, "int32"), tirx.const(23, "int32")))
    return (_horner(r, _EXP_P) * r * r + r + _c(1.0)) * pow2n


def _odd_rational(x: tirx.PrimExpr, bound: float, alpha: list[float],
                  beta: list[float]) -> tirx.PrimExpr:
    """x * P(x^2) / Q(x^2) on x clamped to [-bound, bound] (Eigen's erf and tanh form)."""
    xc = _clamp(x, -bound, bound)
    x2 = xc * xc
    return xc * _horner(x2, alpha) / _horner(x2, beta)


def fast_erf(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 erf(x) as a rational approximation (Eigen)."""
    return _odd_rational(x, 4.0, _ERF_ALPHA, _ERF_BETA)


def fast_tanh(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 tanh(x) as a rational approximation (Eigen)."""
    return _odd_rational(x, 9.0, _TANH_ALPHA, _TANH_BETA)


def fast_sigmoid(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 1 / (1 + e^-x) as a rational approximation (Eigen's logistic)."""
    # at the lower clamp the quotient rounds to just past -0.5: never a negative output
    return tirx.max(_odd_rational(x, 18.0, _LOGISTIC_ALPHA, _LOGISTIC_BETA) + _c(0.5),
                    _c(0.0))


def vector_round(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 round half to even as ``tirx.round``: the same ``llvm.nearbyint`` on CPUs,
    but TVM's vectorizer handles it, while a ``nearbyint`` call (what Relax's ``round``
    legalizes to: every int8 requantisation) left the whole loop scalar."""
    return tirx.round(x)


_REWRITES = {"tirx.exp": fast_exp, "tirx.erf": fast_erf, "tirx.tanh": fast_tanh,
             "tirx.sigmoid": fast_sigmoid, "tirx.nearbyint": vector_round}


def _rewrite_call(call: tvm.ir.expr.Call):
    op = getattr(call, "op", None)
    rewrite = _REWRITES.get(getattr(op, "name", None))
    if rewrite is None or len(call.args) != 1 or str(call.ty) != F32:
        return call
    return rewrite(call.args[0])


def fast_math_func(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with its float32 exp/erf/tanh/sigmoid calls rewritten (itself if none)."""
    return tvm_ffi.structural_map(func, (tvm.ir.expr.Call, _rewrite_call))


@tvm.transform.module_pass(opt_level=0, name="relax_tune.FastMath")
class FastMath:
    """Rewrite float32 exp/erf/tanh/sigmoid in every PrimFunc of the module into vectorisable
    polynomial arithmetic (see the module docstring). Meant for CPU targets, after
    ``FuseTIR``."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = mod.clone()  # update_func mutates in place
        for gv, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc):
                new = fast_math_func(func)
                if not new.same_as(func):
                    out.update_func(gv, new)
        return out
