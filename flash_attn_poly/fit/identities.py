"""Algebraic-identity backward programs: f' rebuilt from the forward program's value.

No new coefficients: each rule replays a committed forward program (runtime.replay, the
semantics spec) and applies the identity in a few packed ops.  Every rule takes
``(program, x, order)`` with ``order`` in runtime.ORDERS and the program dtype (bf16/f16)
as the arithmetic precision; the op sequences (what a kernel runs after the forward block,
``FUSED_OPS[rule]``) are:

* ``sigmoid``  σ' = p(1−p):      ``d = fma.rn(-p, p, p)``                 one rounding
               (neg is a sign-bit xor, exact).  separate: ``mul.rn(p, p)`` then ``sub.rn``.
* ``tanh``     tanh' = 1 − t²:   ``d = fma.rn(-t, t, 1.0)``               one rounding
* ``silu``     SiLU' = p + x·p·(1−p), p = σ(x) (seed B1/B4, the ``silu_bwd_bf16x2`` block):
               ``s = mul.rn(xb, p)`` (the SiLU forward value), ``w = sub.rn(1.0, p)``,
               ``d = fma.rn(s, w, p)``                                       three roundings
               (equals ``tests/asm_reference._silu_grad`` bit for bit; a test pins it).
* ``softcap``  d/dx[c·tanh(x/c)] = 1 − tanh²(u), u = x/c: the scale cancels.  Input is u
               (as for ``softcap_c50_grad``); the kernel clamps x to ±c·L_c first, so
               ``uc = min(max(cvt.rn(u), -L_c), L_c)``, ``rho = block(uc)`` (the forward
               residual ρ = u − tanh u), ``t = sub.rn(uc, rho)``, ``d = fma.rn(-t, t, 1.0)``.
               Beyond the clamp the rule returns 1 − t(L_c)², t the program's tanh at the clamp.

GELU: no algebraic identity applies.  GELU' = Φ(x) + x·φ(x) needs φ = e^{−x²/2}/√(2π),
which is not a rational function of Φ (nor of the committed GELU program, a residual of
x·Φ); only GELU's tanh/sigmoid *approximations* have such identities, and those change
the target.  GELU keeps its direct fit (``gelu_d4_grad``).

``errors_vs_exact(rule, program)`` scores a rule like search.evaluate scores a program:
the 8,000-point grid over [0, 12] with both signs (search.score_points), max abs error;
"real" at the unrounded grid, "separate"/"fused" against the exact derivative at the
rounded inputs (what the kernel is actually asked).
"""
from __future__ import annotations

import numpy as np

from . import runtime as rt
from . import search as S
from .targets import dsigmoid, dsilu, dtanh

FUSED_OPS = {
    "sigmoid": ["p = <sigmoid program>(x)", "d = fma.rn(-p, p, p)          # p(1-p), one rounding"],
    "tanh": ["t = <tanh program>(x)", "d = fma.rn(-t, t, 1.0)        # 1 - t^2, one rounding"],
    "silu": ["xb = cvt.rn(x); p = <sigmoid program>(xb)",
             "s = mul.rn(xb, p)             # SiLU value x*p",
             "w = sub.rn(1.0, p)            # 1 - p",
             "d = fma.rn(s, w, p)           # p + x p (1-p)"],
    "softcap": ["uc = min(max(cvt.rn(u), -L_c), L_c)   # kernel clamps x at +-c*L_c",
                "rho = <softcap residual program>(uc)  # rho = u - tanh(u)",
                "t = sub.rn(uc, rho)           # tanh(u)",
                "d = fma.rn(-t, t, 1.0)        # 1 - t^2 (scale c cancels)"],
}


def _ar(program, order):
    return rt._Arith(order, program.get("dtype", "bf16"))


def sigmoid_grad(program, x, order="fused"):
    """σ' = p(1−p) from a sigmoid forward program (odd form, offset 1/2)."""
    ar = _ar(program, order)
    p = rt.replay(program, x, order)
    return ar.fma(-p, p, p)


def tanh_grad(program, x, order="fused"):
    """tanh' = 1 − t² from a tanh forward program."""
    ar = _ar(program, order)
    t = rt.replay(program, x, order)
    return ar.fma(-t, t, 1.0)


def silu_grad(program, x, order="fused"):
    """SiLU' = p + (x·p)(1−p) from a sigmoid forward program (seed B1/B4: sigmoid_d3)."""
    ar = _ar(program, order)
    xb = ar.inp(np.asarray(x, np.float64))
    p = rt.replay(program, xb, order)
    s = ar.mul(xb, p)
    w = ar.add(1.0, -p)
    return ar.fma(s, w, p)


def softcap_grad(program, u, order="fused"):
    """dtanh/du = 1 − t², t = u − ρ(u), from the softcap residual program (input u = x/c)."""
    ar = _ar(program, order)
    L = program["L_c"]
    uc = rt.pmin(rt.pmax(ar.inp(np.asarray(u, np.float64)), -L), L)
    rho = rt.replay(program, uc, order)
    t = ar.add(uc, -rho)
    return ar.fma(-t, t, 1.0)


RULES = {"sigmoid": sigmoid_grad, "tanh": tanh_grad, "silu": silu_grad, "softcap": softcap_grad}
EXACT = {"sigmoid": dsigmoid, "tanh": dtanh, "silu": dsilu, "softcap": dtanh}
# Real-arithmetic formula of each rule in terms of the forward value v = replay(program, x):
FORMULA = {
    "sigmoid": lambda v, x: v * (1.0 - v),
    "tanh": lambda v, x: 1.0 - v * v,
    "silu": lambda v, x: v + x * v * (1.0 - v),
}


def apply(rule: str, program: dict, x, order: str = "fused") -> np.ndarray:
    return RULES[rule](program, x, order)


def errors_vs_exact(rule, program: dict, x=None) -> dict:
    """Max abs error of an identity rule (name or callable) vs the exact derivative.

    Grid: search.score_points() (8,000 points on [0, 12], both signs).  Keys as in the
    program table: ``real``, ``<dtype>_separate``, ``<dtype>_fused``; softcap adds
    ``<dtype>_fused_u_le_L_c`` (inside the forward clamp)."""
    name = rule if isinstance(rule, str) else next(k for k, v in RULES.items() if v is rule)
    fn, exact = RULES[name], EXACT[name]
    dtype = program.get("dtype", "bf16")
    x = S.score_points() if x is None else np.asarray(x, np.float64)
    out = {"units": "abs", "rule": name, "grid": f"{len(x)} points (search.score_points)"}
    out["real"] = float(np.max(np.abs(fn(program, x, "real") - exact(x))))
    xu = np.unique(rt.round_to(rt.round_to(x, "f32"), dtype))
    fu = exact(xu)
    for order in ("separate", "fused"):
        e = np.abs(fn(program, xu, order) - fu)
        out[f"{dtype}_{order}"] = float(np.max(e))
        if name == "softcap" and order == "fused":
            out[f"{dtype}_fused_u_le_L_c"] = float(np.max(e[np.abs(xu) <= program["L_c"]]))
    return out


def _program_errors(program: dict, exact, x=None) -> dict:
    """Same scoring for a stored backward program (direct or differentiated)."""
    dtype = program.get("dtype", "bf16")
    x = S.score_points() if x is None else x
    out = {"real": float(np.max(np.abs(rt.replay(program, x, "real") - exact(x))))}
    xu = np.unique(rt.round_to(rt.round_to(x, "f32"), dtype))
    e = np.abs(rt.replay(program, xu, "fused") - exact(xu))
    out[f"{dtype}_fused"] = float(np.max(e))
    if program.get("target") == "softcap":
        out[f"{dtype}_fused_u_le_L_c"] = float(np.max(e[np.abs(xu) <= program["L_c"]]))
    return out


# (row label, rule, forward program, direct-fit program, differentiated program or None)
COMPARISON = [
    ("sigmoid", "sigmoid", "sigmoid_d4", "sigmoid_d4_grad", None),
    ("sigmoid (D3 fwd)", "sigmoid", "sigmoid_d3", "sigmoid_d4_grad", None),
    ("tanh", "tanh", "tanh_d4", "tanh_d4_grad_direct", "tanh_d4_grad"),
    ("silu (B1/B4)", "silu", "sigmoid_d3", "silu_d4_grad", None),
    ("silu (D4 sigmoid)", "silu", "sigmoid_d4", "silu_d4_grad", None),
    ("softcap (u = x/c)", "softcap", "softcap_c50", "softcap_c50_grad_direct", "softcap_c50_grad"),
]


def comparison(table: dict) -> list[dict]:
    """Rows: identity rule vs direct fit vs differentiated program, max abs error, BF16."""
    P = table["programs"]
    rows = []
    for label, rule, fwd, direct, diff in COMPARISON:
        ex = EXACT[rule]
        r = {"function": label, "rule": rule, "forward": fwd, "forward_L_c": P[fwd]["L_c"],
             "identity": errors_vs_exact(rule, P[fwd]),
             "direct_program": direct, "direct": _program_errors(P[direct], ex),
             "differentiated_program": diff,
             "differentiated": _program_errors(P[diff], ex) if diff else None}
        rows.append(r)
    return rows


def markdown(rows: list[dict], command: str) -> str:
    def f(e, k="bf16_fused"):
        return "—" if e is None else f"{e[k]:.3g}"

    lines = [
        "# Backward programs: algebraic identity vs direct fit vs differentiated",
        "", f"Command: `{command}`", "",
        "Max abs error vs the exact derivative, fused BF16 replay (runtime.replay order), on the",
        "search grid (8,000 points on [0, 12], both signs; softcap in u = x/c units).",
        "Identity rules replay the committed forward program then the op sequence in",
        "`flash_attn_poly/fit/identities.py` (FUSED_OPS). GELU: no algebraic identity (φ is not",
        "a rational function of Φ), so it has no identity row.", "",
        "| function | forward | identity | direct (program) | differentiated (program) | identity real |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        diff = (f"{f(r['differentiated'])} (`{r['differentiated_program']}`)"
                if r["differentiated"] else "—")
        lines.append(f"| {r['function']} | `{r['forward']}` | {f(r['identity'])} | "
                     f"{f(r['direct'])} (`{r['direct_program']}`) | {diff} | {r['identity']['real']:.3g} |")
    sc = [r for r in rows if r["rule"] == "softcap"]
    if sc:
        r = sc[0]
        k = "bf16_fused_u_le_L_c"
        lines += ["", f"softcap inside the forward clamp (|u| <= L_c = {r['forward_L_c']}"
                  f"): identity {f(r['identity'], k)}, direct {f(r['direct'], k)}, "
                  f"differentiated {f(r['differentiated'], k)}. Beyond the clamp the identity returns "
                  "1 − t(L_c)² (t = L_c − ρ_program(L_c)) where the exact value goes to 0."]
    return "\n".join(lines) + "\n"
