"""Runtime semantics of every polynomial program, in numpy.

This module is the specification the PTX generator (asm/) must match bit for bit.
Values travel as float64 arrays that hold exactly representable bf16/f16/f32
numbers; rounding is done here, never by casting through float32 (which would
round twice).

Orders (``replay(program, x, order)``):

* ``"real"``     stored (rounded) coefficients, float64 arithmetic, input unrounded.
* ``"separate"`` input rounded once; every multiply and every add rounded to the
                 program dtype (the seed's search emulator).
* ``"fused"``    the deployed PTX, op by op (see ``FUSED_OPS``): input rounded
                 once (cvt.rn), abs/clamp/sign/select exact, one rounding per
                 fma.rn, one rounding per other arithmetic op.

Forms (t = min(|x|, L_c), q(t) = sum_k c_k t^k, Horner from c_D down):

* ``odd``           y = offset + sign(x) * q(t), c0 = 0.  sigmoid (offset 1/2), tanh,
                    softcap residual rho, derivatives of SiLU/GELU (offset 1/2).
* ``residual_odd``  same evaluation as ``odd`` (name records the 1/2 + odd residual).
* ``even``          y = q(t).  sigmoid'/tanh' and differentiated odd programs.
* ``residual_even`` y = x/2 + q(t) for |x| <= L_c, exact tail max(x, 0) beyond (SiLU, GELU).
* ``piecewise2``    sigmoid attention: xc = min(max(x, lo), hi); region r = (xc >= thr);
                    u = xc - shift[r] (one rounding; a single sub of a shared constant when
                    shift[0] == shift[1]); q = q_r(u) (degree = len(coeffs[r]) - 1, D3 in
                    the BF16 table entry; coefficients absorb -ln n);
                    y = q^(2^s) by s = params.squarings packed squarings (mul.rn each).
                    q approximates sigma(x - ln n)^(1/2^s): the squarings let a D3 follow
                    e^x in relative terms.
* ``odd_piecewise2`` / ``even_piecewise2``  the two-region softcap (fit/softcap_tail.py):
                    a = min(|xb|, L_c); region r = (a >= thr); v = a - shift[r] (exact for
                    shift 0, else one rounding); h = q_r(v), Horner of the selected
                    coefficients down to c_0 (a c_0 of 0 still costs an fma); odd: y =
                    sign(xb) * h, even: y = h.  No offset, no squarings.
* ``odd_u2``        y = (v * u) * Q(v), v = u * u, u = cvt.rn(x), Q(v) = sum_k c_k v^k: a
                    true odd polynomial (degree 2K + 3), no abs, clamp or sign ops in the
                    block.  The caller clamps x to [-L_c, L_c] first (the softcap kernels do
                    it on the FMA pipe with fma.rn.sat.f32; fit/softcap_odd.py).
* ``piecewise2_factored``  derivative surrogate dy = P * g, g = a_r + b_r * u, P the
                    forward value (after the squarings) of the same u; with
                    params.g_squared: dy = P * (g * g) (two roundings).
"""
from __future__ import annotations

import numpy as np

# (significand bits incl. hidden, min normal exponent, max exponent)
FORMATS = {"bf16": (8, -126, 127), "f16": (11, -14, 15), "f32": (24, -126, 127)}
BITS = {"bf16": 16, "f16": 16, "f32": 32}
ORDERS = ("real", "separate", "fused")

FUSED_OPS = {
    "odd": [
        "xb = cvt.rn(x)                      # input rounded once (identity for bf16 inputs)",
        "a  = xb & 0x7fff                    # abs, exact",
        "a  = min(a, L_c)                    # PTX min: NaN operand -> the other operand",
        "h  = c_D; h = fma.rn(h, a, c_k) for k = D-1 .. 1   # one rounding each",
        "q  = mul.rn(h, a)                   # c0 = 0: last Horner step is a multiply",
        "y  = q ^ (xb & 0x8000)              # sign restore, exact (xor)",
        "y  = add.rn(y, offset)              # only when offset != 0, one rounding",
    ],
    "even": [
        "xb = cvt.rn(x); a = min(xb & 0x7fff, L_c)",
        "h  = c_D; h = fma.rn(h, a, c_k) for k = D-1 .. 0",
        "y  = add.rn(h, offset)              # only when offset != 0",
    ],
    "residual_even": [
        "xb = cvt.rn(x); a = xb & 0x7fff; ac = min(a, L_c)",
        "h  = c_D; h = fma.rn(h, ac, c_k) for k = D-1 .. 1; q = mul.rn(h, ac)",
        "p  = fma.rn(xb, 0.5, q)             # x/2 + residual, one rounding",
        "m  = set.gt(a, L_c)                 # NaN -> false",
        "y  = m ? max(xb, 0) : p             # exact tail, lop3 0xca select",
    ],
    "piecewise2": [
        "xb = cvt.rn.bf16x2.f32(x)",
        "xc = min(max(xb, lo), hi)           # constants via mov.b32; PTX NaN rule",
        "m  = set.ge.u32(xc, thr)            # 0xffff per lane where xc >= thr",
        "u  = sub.rn(xc, shift_r)            # only if shift present: lop3 select (skipped when",
        "                                    #   both shifts are equal) + one rounding",
        "c_k = lop3(m, c_k[hi], c_k[lo], 0xca) for k = 0..3",
        "h  = c_D; h = fma.rn(h, u, c_k) for k = D-1 .. 0 -> y   # D = 3 in the BF16 entry",
        "y  = mul.rn(y, y)                   # params.squarings times (0 if absent)",
    ],
    "piecewise2_factored": [
        "(forward ops above give u and P = y)",
        "a = lop3(m, a[hi], a[lo], 0xca); b = lop3(m, b[hi], b[lo], 0xca)",
        "g  = fma.rn(b, u, a)",
        "g  = mul.rn(g, g)                   # only with params.g_squared",
        "dy = mul.rn(P, g)",
    ],
}
FUSED_OPS["odd_piecewise2"] = [
    "xb = cvt.rn(x); a = min(xb & 0x7fff, L_c)",
    "m  = set.ge.u32(a, thr)             # 0xffff per lane where a >= thr",
    "v  = sub.rn(a, lop3(m, shift[1], shift[0], 0xca))   # one rounding",
    "c_k = lop3(m, c_k[hi], c_k[lo], 0xca) for k = 0..D",
    "h  = c_D; h = fma.rn(h, v, c_k) for k = D-1 .. 0",
    "y  = h ^ (xb & 0x8000)              # sign restore, exact (lop3 0x6a)",
]
FUSED_OPS["odd_u2"] = [
    "u  = cvt.rn(x)                      # x already clamped to [-L_c, L_c] by the caller",
    "v  = mul.rn(u, u); t = mul.rn(v, u)",
    "h  = c_K; h = fma.rn(h, v, c_k) for k = K-1 .. 0",
    "y  = mul.rn(h, t)",
]
FUSED_OPS["even_piecewise2"] = FUSED_OPS["odd_piecewise2"][:-1]
FUSED_OPS["residual_odd"] = FUSED_OPS["odd"]


def round_to(x, dtype: str, sticky=None) -> np.ndarray:
    """Round float64 values to the nearest `dtype` value, ties to even (IEEE RNE).

    Handles NaN, +-inf, overflow to inf and subnormals of the target.  `sticky`
    (same shape, optional) is the sign of a residual the float64 value dropped
    (x_exact = x + tiny): it breaks exact ties the way the exact value would.
    """
    p, emin, emax = FORMATS[dtype]
    x = np.asarray(x, dtype=np.float64)
    finite = np.isfinite(x) & (x != 0)
    xs = np.where(finite, x, 1.0)
    _, e = np.frexp(xs)  # xs = m * 2**e, 0.5 <= |m| < 1
    quantum = np.ldexp(1.0, np.maximum(e - 1, emin) - (p - 1))
    y = xs / quantum  # exact: power-of-two scaling
    r = np.rint(y)  # ties to even
    if sticky is not None:
        tie = np.abs(y - np.trunc(y)) == 0.5
        s = np.sign(np.broadcast_to(sticky, y.shape))
        r = np.where(tie & (s > 0), np.ceil(y), np.where(tie & (s < 0), np.floor(y), r))
    out = r * quantum
    max_finite = (2.0 - 2.0 ** (1 - p)) * 2.0**emax
    out = np.where(np.abs(out) > max_finite, np.copysign(np.inf, out), out)
    return np.where(finite, out, x)  # NaN, inf, and signed zero pass through


def fma(a, b, c, dtype: str) -> np.ndarray:
    """fma.rn: a*b + c with a single rounding.

    a*b of two 16-bit values is exact in float64; the sum's dropped part is
    recovered with TwoSum so the final rounding is correct even at ties."""
    prod = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = prod + c
    bb = s - prod
    err = (prod - (s - bb)) + (c - bb)
    err = np.where(np.isfinite(err), err, 0.0)
    return round_to(s, dtype, sticky=err)


def mul(a, b, dtype: str) -> np.ndarray:
    return round_to(np.asarray(a, np.float64) * np.asarray(b, np.float64), dtype)


def add(a, b, dtype: str) -> np.ndarray:
    return fma(a, 1.0, b, dtype)


def pmin(a, b):
    """PTX min.{bf16,f16}x2: a NaN operand yields the other operand."""
    return np.fmin(a, b)


def pmax(a, b):
    return np.fmax(a, b)


def to_bits(y, dtype: str) -> np.ndarray:
    """Bit patterns of exactly representable values; NaN -> canonical 0x7fff (bf16) /
    0x7fff (f16) as PTX produces."""
    y = np.asarray(y, np.float64)
    if dtype == "bf16":
        b = (y.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        return np.where(np.isnan(y), np.uint16(0x7FFF), b)
    if dtype == "f16":
        b = y.astype(np.float16).view(np.uint16)
        return np.where(np.isnan(y), np.uint16(0x7FFF), b)
    if dtype == "f32":
        b = y.astype(np.float32).view(np.uint32)
        return np.where(np.isnan(y), np.uint32(0x7FFFFFFF), b)
    raise ValueError(dtype)


@np.errstate(invalid="ignore")  # signalling-NaN patterns warn on the widening cast
def from_bits(bits, dtype: str) -> np.ndarray:
    bits = np.asarray(bits)
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dtype == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    if dtype == "f32":
        return bits.astype(np.uint32).view(np.float32).astype(np.float64)
    raise ValueError(dtype)


def all_inputs(dtype: str = "bf16") -> np.ndarray:
    """All 65,536 16-bit patterns as float64 values (NaNs included)."""
    return from_bits(np.arange(1 << 16, dtype=np.uint32), dtype)


# ---------------------------------------------------------------------------
# Arithmetic back-ends: one object per order, so each form is written once.

class _Arith:
    def __init__(self, order: str, dtype: str):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.order, self.dtype = order, dtype

    def inp(self, x):
        if self.order == "real":
            return np.asarray(x, np.float64)
        # Kernels hand FP32 (or already-16-bit) values to cvt.rn: round to f32 first.
        return round_to(round_to(x, "f32"), self.dtype)

    def fma(self, a, b, c):
        if self.order == "real":
            return a * b + c
        if self.order == "separate":
            return add(round_to(a * b, self.dtype), c, self.dtype)
        return fma(a, b, c, self.dtype)

    def mul(self, a, b):
        return a * b if self.order == "real" else mul(a, b, self.dtype)

    def add(self, a, b):
        return a + b if self.order == "real" else add(a, b, self.dtype)


def _coeffs(program, fp64: bool):
    return program["coeffs_fp64"] if fp64 else program["coeffs"]


def horner(ar: _Arith, coeffs, t, zero_c0: bool):
    """Horner from the top; with zero_c0 the last step is a multiply (no add of 0)."""
    c = [float(v) for v in coeffs]
    h = np.full_like(t, c[-1])
    last = 1 if zero_c0 else 0
    for k in range(len(c) - 2, last - 1, -1):
        h = ar.fma(h, t, c[k])
    return ar.mul(h, t) if zero_c0 else h


def _odd(program, ar, x, fp64):
    xb = ar.inp(x)
    a = pmin(np.abs(xb), program["L_c"])
    q = horner(ar, _coeffs(program, fp64), a, zero_c0=True)
    y = np.where(np.signbit(xb), -q, q)
    off = program.get("offset", 0.0)
    return ar.add(y, off) if off != 0.0 else y


def _even(program, ar, x, fp64):
    xb = ar.inp(x)
    a = pmin(np.abs(xb), program["L_c"])
    y = horner(ar, _coeffs(program, fp64), a, zero_c0=False)
    off = program.get("offset", 0.0)
    return ar.add(y, off) if off != 0.0 else y


def _residual_even(program, ar, x, fp64):
    xb = ar.inp(x)
    a = np.abs(xb)
    ac = pmin(a, program["L_c"])
    q = horner(ar, _coeffs(program, fp64), ac, zero_c0=True)
    if ar.order == "separate":
        p = ar.add(ar.mul(xb, 0.5), q)
    else:
        p = ar.fma(xb, 0.5, q)
    return np.where(a > program["L_c"], pmax(xb, 0.0), p)


def _pw_u(program, ar, x):
    """Shared front of the piecewise2 forms: clamp, region mask, region-local u."""
    pr = program["params"]
    xb = ar.inp(x)
    xc = pmin(pmax(xb, pr["lo"]), pr["hi"])
    m = xc >= pr["thr"]
    shift = pr.get("shift")
    if shift:
        s = np.where(m, shift[1], shift[0])
        u = xc - s if ar.order == "real" else round_to(xc - s, ar.dtype)
    else:
        u = xc
    return m, u


def _pw_value(program, ar, m, u, fp64):
    cs = _coeffs(program, fp64)
    c = [np.where(m, hi, lo) for lo, hi in zip(cs[0], cs[1])]
    h = c[-1]
    for k in range(len(c) - 2, -1, -1):
        h = ar.fma(h, u, c[k])
    for _ in range(int(program["params"].get("squarings") or 0)):
        h = ar.mul(h, h)
    return h


def _piecewise2(program, ar, x, fp64):
    m, u = _pw_u(program, ar, x)
    return _pw_value(program, ar, m, u, fp64)


def _piecewise2_factored(program, ar, x, fp64):
    m, u = _pw_u(program, ar, x)
    P = _pw_value(program, ar, m, u, fp64)
    pr = program["params"]
    key_a, key_b = ("a_fp64", "b_fp64") if fp64 else ("a", "b")
    a = np.where(m, pr[key_a][1], pr[key_a][0])
    b = np.where(m, pr[key_b][1], pr[key_b][0])
    g = ar.fma(b, u, a)
    if pr.get("g_squared"):
        g = ar.mul(g, g)
    return ar.mul(P, g)


def _pw2_abs(program, ar, x, fp64, odd: bool):
    """odd_piecewise2 / even_piecewise2 (module docstring)."""
    pr = program["params"]
    xb = ar.inp(x)
    a = pmin(np.abs(xb), program["L_c"])
    m = a >= pr["thr"]
    s = np.where(m, pr["shift"][1], pr["shift"][0])
    v = a - s if ar.order == "real" else round_to(a - s, ar.dtype)
    h = _pw_value(program, ar, m, v, fp64)   # the piecewise2 Horner (no squarings here)
    return np.where(np.signbit(xb), -h, h) if odd else h


def _odd_u2(program, ar, x, fp64):
    """odd_u2 (module docstring): no clamp here, the caller's."""
    u = ar.inp(x)
    v = ar.mul(u, u)
    t = ar.mul(v, u)
    return ar.mul(horner(ar, _coeffs(program, fp64), v, zero_c0=False), t)


_FORMS = {
    "odd_u2": _odd_u2,
    "odd_piecewise2": lambda program, ar, x, fp64: _pw2_abs(program, ar, x, fp64, True),
    "even_piecewise2": lambda program, ar, x, fp64: _pw2_abs(program, ar, x, fp64, False),
    "odd": _odd,
    "residual_odd": _odd,
    "even": _even,
    "residual_even": _residual_even,
    "piecewise2": _piecewise2,
    "piecewise2_factored": _piecewise2_factored,
}


def replay(program: dict, x, order: str = "fused", fp64_coeffs: bool = False) -> np.ndarray:
    """Evaluate `program` at x in the given order (see module docstring).

    Returns float64 values; for "separate"/"fused" they are exact dtype values.
    fp64_coeffs=True uses the unrounded solution (only meaningful with "real")."""
    form = program["form"]
    if form not in _FORMS:
        raise ValueError(f"unknown form {form!r}")
    ar = _Arith(order, program.get("dtype", "bf16"))
    return _FORMS[form](program, ar, np.asarray(x, np.float64), fp64_coeffs)


def softcap_logit(program: dict, x, order: str = "fused") -> np.ndarray:
    """Full softcap chain in logit units for a residual-form program (target softcap).

    Kernel (FP32 except the packed rho block):
        x32 = x (FP32 score); xc = min(max(x32, -c*L_c), c*L_c)      # FP32, exact
        u   = mul.rn.f32(xc, rn32(1/c))
        rho = block(u)  -- the odd-form program (cvt.rn.bf16, |.|, Horner, sign)
        out = fma.rn.f32(-c, rho, xc)                               # logit = xc - c*rho
    """
    if program["form"] == "odd_u2":
        return _softcap_logit_u2(program, x, order)
    c = float(program["params"]["c"])
    lc = program["L_c"] * c
    x = np.asarray(x, np.float64)
    two = program["form"] == "odd_piecewise2"
    if order == "real":
        xc = np.clip(x, -lc, lc)
        a = np.where(two & (np.abs(xc) >= c * program["params"].get("thr", np.inf)), np.sign(xc) * c, xc)
        return a - c * replay(program, xc / c, "real")
    x32 = round_to(x, "f32")
    xc = pmin(pmax(x32, -lc), lc)
    u = mul(xc, round_to(1.0 / c, "f32"), "f32")
    rho = replay(program, u, order)
    if two:   # tail region: logit = sign(x) c - c (sign(x) eps), the same region test as the block
        xc = np.where(np.abs(u) >= region_threshold_f32(program), np.copysign(c, xc), xc)
    return fma(-c, rho, xc, "f32")


def _softcap_logit_u2(program: dict, x, order: str) -> np.ndarray:
    """softcap_logit of an odd_u2 program (fit/softcap_odd.py).  Kernel:
        u   = clamp(x / c, +-L_c)  -- fma.rn.sat.f32(s, scale/(2 c L_c), 0.5) * 2 L_c - L_c:
              within a few FP32 ulps of mul.rn.f32(x, rn32(1/c)) clamped, modelled as the latter
        rho = block(u)            -- cvt.rn.f16x2, v = u^2, (v u) Q(v)
        out = fma.rn.f32(-c, rho, mul.rn.f32(c, u))   # logit = c u - c rho
    """
    c = float(program["params"]["c"])
    L = float(program["L_c"])
    x = np.asarray(x, np.float64)
    if order == "real":
        u = np.clip(x / c, -L, L)
        return c * u - c * replay(program, u, "real")
    u = pmin(pmax(mul(round_to(x, "f32"), round_to(1.0 / c, "f32"), "f32"), -L), L)
    rho = replay(program, u, order)
    return fma(-c, rho, mul(c, u, "f32"), "f32")


def region_threshold_f32(program: dict) -> float:
    """The least FP32 value t with cvt.rn to the program dtype of t >= params.thr, so that for
    an FP32 u, |u| >= t exactly when the block's a = |cvt.rn(u)| >= thr (cvt.rn is monotone).
    A kernel's FP32 side uses it to pick the same region as the packed block."""
    thr, dt = float(program["params"]["thr"]), program.get("dtype", "bf16")
    # bisection on the bit patterns of [0, thr]: rn(thr) >= thr, rn(0) < thr
    lo_b, hi_b = 0, int(np.float32(thr).view(np.uint32))
    while hi_b - lo_b > 1:
        mid = (lo_b + hi_b) // 2
        if round_to(np.array([np.uint32(mid).view(np.float32)], np.float64), dt)[0] >= thr:
            hi_b = mid
        else:
            lo_b = mid
    return float(np.uint32(hi_b).view(np.float32))
