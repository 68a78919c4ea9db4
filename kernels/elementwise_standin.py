"""TEMPORARY stand-in for ``flash_attn_poly.asm`` blocks used by ``kernels/elementwise.py``.

Delete this file once ``asm/cute_ops.py`` provides the packed blocks named in
docs/DESIGN.md (``silu_fwd_bf16x2``, ``<fn>_fwd_f16x2``, ...) and
``flash_attn_poly/data/programs.json`` holds the programs.  Until then it:

* reads a program from ``programs.json`` when the file has it, otherwise fits a
  stand-in in FP64 least squares (same form, same clamp convention) and rounds
  the coefficients to the program dtype -- computed here, never hand-typed;
* writes PTX that follows ``fit.runtime.FUSED_OPS`` op by op, so the CPU
  reference ``fit.runtime.replay(program, x, "fused")`` is bit-exact for it.

Everything here is pure Python (no cutlass import): the CuTe DSL side lives in
``kernels/elementwise_ops.py``.
"""
from __future__ import annotations

import functools
import json
import os

import numpy as np

from flash_attn_poly.fit import runtime

_TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "flash_attn_poly", "data", "programs.json")

# Stand-in recipes: form, offset, degree and the clamp grid searched.  Degrees: D3 for
# the B1/B4 sigmoid (the seed's program), D4 for the FP16 sweep (the seed's direct D4
# derivative fits; D4 values too, for want of the table).
_RECIPES = {
    "sigmoid_d3": ("sigmoid", False, "odd", 0.5, 3, "bf16"),
    "sigmoid_d4": ("sigmoid", False, "odd", 0.5, 4, "f16"),
    "tanh_d4": ("tanh", False, "odd", 0.0, 4, "f16"),
    "silu_d4": ("silu", False, "residual_even", 0.0, 4, "f16"),
    "gelu_d4": ("gelu", False, "residual_even", 0.0, 4, "f16"),
    "sigmoid_d4_grad": ("sigmoid", True, "even", 0.0, 4, "f16"),
    "tanh_d4_grad": ("tanh", True, "even", 0.0, 4, "f16"),
    "silu_d4_grad": ("silu", True, "residual_odd", 0.5, 4, "f16"),
    "gelu_d4_grad": ("gelu", True, "residual_odd", 0.5, 4, "f16"),
}


def _target(fn: str, derivative: bool, x: np.ndarray) -> np.ndarray:
    from math import erf, pi, sqrt

    sig = 1.0 / (1.0 + np.exp(-x))
    if fn == "sigmoid":
        return sig * (1 - sig) if derivative else sig
    if fn == "tanh":
        return 1 - np.tanh(x) ** 2 if derivative else np.tanh(x)
    if fn == "silu":
        return sig * (1 + x * (1 - sig)) if derivative else x * sig
    phi = 0.5 * (1 + np.vectorize(erf)(x / sqrt(2.0)))
    if derivative:
        return phi + x * np.exp(-0.5 * x * x) / sqrt(2 * pi)
    return x * phi


def _fit(name: str) -> dict:
    """Least-squares stand-in: best clamp on a grid, scored with the fused replay."""
    fn, deriv, form, offset, degree, dtype = _RECIPES[name]
    zero_c0 = form != "even"
    powers = np.arange(1 if zero_c0 else 0, degree + 1)
    score_x = np.linspace(-12.0, 12.0, 8001)
    best = None
    for lc in np.arange(1.5, 8.01, 0.25):
        t = np.linspace(0.0, lc, 2000)
        y = _target(fn, deriv, t)
        if form == "odd" or form == "residual_odd":
            y = y - offset
        elif form == "residual_even":
            y = y - t / 2
        sol = np.linalg.lstsq(t[:, None] ** powers[None, :], y, rcond=None)[0]
        coeffs = np.zeros(degree + 1)
        coeffs[powers] = sol
        rounded = runtime.round_to(coeffs, dtype)
        prog = {"target": fn, "derivative": deriv, "form": form, "dtype": dtype,
                "degree": degree, "L_i": float(lc), "L_c": float(lc), "offset": offset,
                "coeffs": [float(c) for c in rounded], "coeffs_fp64": [float(c) for c in coeffs],
                "standin": True}
        err = np.max(np.abs(runtime.replay(prog, score_x, "fused") - _target(fn, deriv, score_x)))
        if best is None or err < best[0]:
            best = (err, prog)
    best[1]["errors"] = {"units": "abs", "fused_standin": float(best[0])}
    return best[1]


@functools.lru_cache(maxsize=None)
def program(name: str) -> dict:
    """The program `name` from programs.json, else a stand-in fit (marked ``standin``)."""
    if os.path.exists(_TABLE):
        with open(_TABLE) as f:
            progs = json.load(f).get("programs", {})
        if name in progs:
            return progs[name]
    return _fit(name)


def _bits(value: float, dtype: str) -> int:
    return int(runtime.to_bits(runtime.round_to(value, dtype), dtype))


def _pair(value: float, dtype: str) -> str:
    """A constant broadcast to both lanes, as a PTX hex immediate."""
    b = _bits(value, dtype)
    return f"0x{(b << 16) | b:08x}"


def program_lines(prog: dict, x: str, out: str) -> list[str]:
    """PTX lines evaluating `prog` on packed register `x` into `out` (FUSED_OPS order).

    Scratch registers: %a %ac %h %c %s %m (declared by the caller's block)."""
    t = "bf16x2" if prog["dtype"] == "bf16" else "f16x2"
    dt = prog["dtype"]
    c = [float(v) for v in prog["coeffs"]]
    form = prog["form"]
    zero_c0 = form != "even"
    lines = [f"and.b32 %a, {x}, 0x7fff7fff;",
             f"mov.b32 %c, {_pair(prog['L_c'], dt)};",
             f"min.{t} %ac, %a, %c;",
             f"mov.b32 %h, {_pair(c[-1], dt)};"]
    for k in range(len(c) - 2, (1 if zero_c0 else 0) - 1, -1):
        lines += [f"mov.b32 %c, {_pair(c[k], dt)};", f"fma.rn.{t} %h, %h, %ac, %c;"]
    if zero_c0:
        lines.append(f"mul.rn.{t} %h, %h, %ac;")
    if form in ("odd", "residual_odd"):
        lines += [f"and.b32 %s, {x}, 0x80008000;", "xor.b32 %h, %h, %s;"]
    if form == "residual_even":
        # p = x/2 + q; beyond L_c the exact tail max(x, 0), selected per lane (lop3 0xca).
        lines += [f"mov.b32 %c, {_pair(0.5, dt)};", f"fma.rn.{t} %h, {x}, %c, %h;",
                  f"mov.b32 %c, {_pair(prog['L_c'], dt)};",
                  f"set.gt.u32.{t} %m, %a, %c;",
                  "mov.b32 %s, 0;",
                  f"max.{t} %s, {x}, %s;",
                  "lop3.b32 %h, %m, %s, %h, 0xca;"]
    elif prog.get("offset", 0.0) != 0.0:
        lines += [f"mov.b32 %c, {_pair(prog['offset'], dt)};", f"add.rn.{t} %h, %h, %c;"]
    lines.append(f"mov.b32 {out}, %h;")
    return lines


_SCRATCH = ".reg .b32 %a, %ac, %h, %c, %s, %m, %p, %d, %e;"


def _block(lines: list[str]) -> str:
    return "{\n" + _SCRATCH + "\n" + "\n".join(lines) + "\n}"


def block_text(name: str) -> tuple[str, str, int]:
    """(PTX text, constraints, number of outputs) of a stand-in packed block.

    Operands: outputs first ($0..), then inputs.  Composition rules beyond the program
    (SiLU = x*p, its backward p + x*p*(1-p), SwiGLU) are one rounding per op."""
    if name.endswith("_bf16x2"):
        p = program("sigmoid_d3")
        body = program_lines(p, "$1", "%p")
        one = _pair(1.0, "bf16")
        if name == "sigmoid_bf16x2":
            return _block(body + ["mov.b32 $0, %p;"]), "=r,r", 1
        if name == "silu_fwd_bf16x2":  # y = x * p
            return _block(body + ["mul.rn.bf16x2 $0, $1, %p;"]), "=r,r", 1
        # d = p + x*p*(1-p): e = 1 - p; s = x*p; d = fma(s, e, p)
        deriv = [f"mov.b32 %c, {one};", "sub.rn.bf16x2 %e, %c, %p;"]
        if name == "silu_bwd_bf16x2":  # x -> silu'(x); the kernel multiplies by g
            deriv += ["mul.rn.bf16x2 %s, $1, %p;", "fma.rn.bf16x2 $0, %s, %e, %p;"]
            return _block(body + deriv), "=r,r", 1
        if name == "swiglu_fwd_bf16x2":  # (gate, up) -> (gate * p) * up
            return _block(body + ["mul.rn.bf16x2 %s, $1, %p;", "mul.rn.bf16x2 $0, %s, $2;"]), \
                "=r,r,r", 1
        if name == "swiglu_bwd_bf16x2":  # (gate, up, g) -> (g*up*d, g*gate*p)
            # operands: $0 dgate, $1 dup, $2 gate, $3 up, $4 g
            body = program_lines(p, "$2", "%p")
            deriv += ["mul.rn.bf16x2 %s, $2, %p;",          # silu(gate)
                      "mul.rn.bf16x2 $1, $4, %s;",          # d_up = g * silu
                      "fma.rn.bf16x2 %d, %s, %e, %p;",      # silu'(gate)
                      "mul.rn.bf16x2 %e, $4, $3;",          # g * up
                      "mul.rn.bf16x2 $0, %e, %d;"]          # d_gate
            return _block(body + deriv), "=r,=r,r,r,r", 2
    if name.endswith("_f16x2"):
        fn, direction = name[: -len("_f16x2")].rsplit("_", 1)
        if direction == "fwd":
            body = program_lines(program(f"{fn}_d4"), "$1", "$0")
            return _block(body), "=r,r", 1
        body = program_lines(program(f"{fn}_d4_grad"), "$1", "$0")
        return _block(body), "=r,r", 1  # x -> f'(x); the kernel multiplies by g
    raise KeyError(f"no stand-in block {name!r}")


# ---- CPU reference of the stand-in blocks (op by op, bit-exact) --------------------------

def reference(name: str, programs: list, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
    """float64 exact-dtype values of block `name` (built from the program dicts `programs`,
    the blocks' composition order of asm/blocks.py) for float64 inputs."""
    if name.endswith("_f16x2"):
        return (runtime.replay(programs[0], inputs[0], "fused"),)
    bf = "bf16"
    x = inputs[0]
    p = runtime.replay(programs[0], x, "fused")
    if name == "sigmoid_bf16x2":
        return (p,)
    if name == "silu_fwd_bf16x2":
        return (runtime.mul(x, p, bf),)
    e = runtime.add(1.0, -p, bf)
    s = runtime.mul(x, p, bf)
    d = runtime.fma(s, e, p, bf)
    if name == "silu_bwd_bf16x2":
        return (d,)
    if name == "swiglu_fwd_bf16x2":
        return (runtime.mul(s, inputs[1], bf),)
    if name == "swiglu_bwd_bf16x2":
        up, g = inputs[1], inputs[2]
        return (runtime.mul(runtime.mul(g, up, bf), d, bf), runtime.mul(g, s, bf))
    raise KeyError(name)
