"""Small PTX emission helpers: a builder that names registers, materialises packed constants
with ``mov.b32`` (packed bf16x2/f16x2 arithmetic takes no immediates) and emits the
per-form program bodies in exactly the op order of ``fit/runtime.py`` (``FUSED_OPS``).
No coefficient lives here: every constant comes from a program dict of the table.
"""
from __future__ import annotations

import numpy as np

from . import fpbits as fb

SIGN2 = 0x80008000     # sign bits of both lanes
ABS2 = 0x7FFF7FFF      # everything but the sign bits
LUT_SELECT = 0xCA      # lop3: a ? b : c bitwise  ((0xF0 & 0xCC) | (~0xF0 & 0xAA))
LUT_SIGN_XOR = 0x6A    # lop3: (a & b) ^ c       ((0xF0 & 0xCC) ^ 0xAA): sign restore in one op


def half_bits(value: float, fmt: fb.Fmt) -> int:
    """16-bit pattern of a value that must already be exactly representable in fmt."""
    v = np.float64(value)
    bits = int(fb.encode(np.array([v]), fmt)[0])
    if fb.decode(np.array([bits]), fmt)[0] != v and not np.isnan(v):
        raise ValueError(f"{value!r} is not exactly representable in {fmt.name}")
    return bits


def splat(bits16: int) -> int:
    """The same 16-bit pattern in both lanes."""
    return (bits16 << 16) | bits16


class Builder:
    """Accumulates instructions; registers are b32 temporaries r0, r1, ..."""

    def __init__(self, ptype: str):
        self.ptype = ptype                    # "bf16x2" or "f16x2"
        self.fmt = fb.FMTS[ptype]
        self.lines: list[str] = []
        self.n_regs = 0
        self._consts: dict[int, str] = {}

    def reg(self) -> str:
        self.n_regs += 1
        return f"r{self.n_regs - 1}"

    def emit(self, opcode: str, *operands: str) -> str:
        """Emit ``opcode dst, operands`` into a fresh register and return it."""
        dst = self.reg()
        self.lines.append(f"{opcode} {', '.join((dst,) + operands)}")
        return dst

    def const(self, word: int) -> str:
        """A register holding the 32-bit word (one mov.b32, shared by later uses)."""
        if word not in self._consts:
            self._consts[word] = self.emit("mov.b32", f"0x{word:08x}")
        return self._consts[word]

    def value(self, v: float) -> str:
        return self.const(splat(half_bits(v, self.fmt)))

    # packed float ops (all operands registers)
    def fma(self, a, b, c):
        return self.emit(f"fma.rn.{self.ptype}", a, b, c)

    def mul(self, a, b):
        return self.emit(f"mul.rn.{self.ptype}", a, b)

    def add(self, a, b):
        return self.emit(f"add.rn.{self.ptype}", a, b)

    def sub(self, a, b):
        return self.emit(f"sub.rn.{self.ptype}", a, b)

    def min(self, a, b):
        return self.emit(f"min.{self.ptype}", a, b)

    def max(self, a, b):
        return self.emit(f"max.{self.ptype}", a, b)

    def set(self, cmp, a, b):
        return self.emit(f"set.{cmp}.u32.{self.ptype}", a, b)

    def select(self, mask, if_set: str, if_clear: str):
        """Per-bit mask ? if_set : if_clear; immediates allowed (lop3 takes them)."""
        return self.emit("lop3.b32", mask, if_set, if_clear, f"0x{LUT_SELECT:02x}")

    def cvt_pack(self, lane0_f32: str, lane1_f32: str):
        # cvt.rn.{bf16x2,f16x2}.f32 d, a, b puts a in the upper half: lane 1 goes first.
        return self.emit(f"cvt.rn.{self.ptype}.f32", lane1_f32, lane0_f32)


def imm(word: int) -> str:
    return f"0x{word:08x}"


# ----------------------------------------------------------------------------- program bodies
def horner(b: Builder, coeffs, t: str, zero_c0: bool) -> str:
    """h = c_D; h = fma(h, t, c_k) down to k = 1 (zero_c0: then mul by t) or k = 0."""
    h = b.value(coeffs[-1])
    last = 1 if zero_c0 else 0
    for k in range(len(coeffs) - 2, last - 1, -1):
        h = b.fma(h, t, b.value(coeffs[k]))
    return b.mul(h, t) if zero_c0 else h


def clamped_abs(b: Builder, x: str, L_c: float):
    a = b.emit("and.b32", x, imm(ABS2))
    return a, b.min(a, b.value(L_c))


def odd(b: Builder, prog: dict, x: str, limit: float | None = None) -> str:
    """offset + sign(x) * q(min(|x|, L_c)), c0 = 0.

    limit: an exact tail beyond the clamp (|x| > L_c): q is limit - offset there, so the value is
    exactly limit (x > 0) or 2 * offset - limit (x < 0), the function's asymptotes (sigmoid: 1
    and 0) instead of the polynomial's value at L_c.  The SiLU blocks need it: x * p(x) with
    p(L_c) = 1 - 2^-8 grows as x / 256 below -L_c, and the backward rule p + x p (1 - p) as
    x / 256 on both sides; with the tail they are 0 / x and 0 / 1 there."""
    a, ac = clamped_abs(b, x, prog["L_c"])
    q = horner(b, prog["coeffs"], ac, zero_c0=True)
    off = float(prog.get("offset", 0.0))
    if limit is not None:
        beyond = b.set("gt", a, b.value(prog["L_c"]))      # NaN compares false: keeps q (NaN)
        q = b.select(beyond, imm(splat(half_bits(limit - off, b.fmt))), q)
    y = b.emit("lop3.b32", x, imm(SIGN2), q, f"0x{LUT_SIGN_XOR:02x}")
    return b.add(y, b.value(off)) if off != 0.0 else y


def even(b: Builder, prog: dict, x: str) -> str:
    _, a = clamped_abs(b, x, prog["L_c"])
    y = horner(b, prog["coeffs"], a, zero_c0=False)
    off = float(prog.get("offset", 0.0))
    return b.add(y, b.value(off)) if off != 0.0 else y


def residual_even(b: Builder, prog: dict, x: str) -> str:
    """x/2 + q(min(|x|, L_c)) inside the clamp, exact tail max(x, 0) beyond it."""
    a, ac = clamped_abs(b, x, prog["L_c"])
    q = horner(b, prog["coeffs"], ac, zero_c0=True)
    p = b.fma(x, b.value(0.5), q)
    beyond = b.set("gt", a, b.value(prog["L_c"]))      # NaN compares false: keeps p
    tail = b.max(x, b.value(0.0))
    return b.select(beyond, tail, p)


def abs_piecewise2(b: Builder, prog: dict, x: str, odd_out: bool) -> str:
    """odd_piecewise2 / even_piecewise2 (fit/runtime.py): a = min(|x|, L_c), region mask
    a >= thr, v = a - shift[r], Horner of the selected coefficients down to c_0, sign of x
    restored for the odd form (the two-region softcap, fit/softcap_tail.py)."""
    pr = prog["params"]
    _, a = clamped_abs(b, x, prog["L_c"])
    m = b.set("ge", a, b.value(pr["thr"]))
    h = piecewise_value(b, prog, m, b.sub(a, select_pair(b, m, *pr["shift"])))   # no squarings
    return b.emit("lop3.b32", x, imm(SIGN2), h, f"0x{LUT_SIGN_XOR:02x}") if odd_out else h


def odd_u2(b: Builder, prog: dict, x: str) -> str:
    """(v * x) * Q(v), v = x * x (fit/runtime.py odd_u2): no clamp, abs or sign ops; the
    caller hands in x already clamped to [-L_c, L_c]."""
    v = b.mul(x, x)
    t = b.mul(v, x)
    return b.mul(horner(b, prog["coeffs"], v, zero_c0=False), t)


FORMS = {"odd": odd, "odd_u2": odd_u2, "residual_odd": odd, "even": even, "residual_even": residual_even,
         "odd_piecewise2": lambda b, prog, x: abs_piecewise2(b, prog, x, True),
         "even_piecewise2": lambda b, prog, x: abs_piecewise2(b, prog, x, False)}


def piecewise_front(b: Builder, prog: dict, xb: str):
    """Clamp, region mask and region-local u of a piecewise2 program."""
    pr = prog["params"]
    xc = b.min(b.max(xb, b.value(pr["lo"])), b.value(pr["hi"]))
    m = b.set("ge", xc, b.value(pr["thr"]))
    shift = pr.get("shift")
    if shift:
        if shift[0] == shift[1]:
            # one shared shift: no select; b.value reuses the lo/thr/hi register when equal
            return m, b.sub(xc, b.value(shift[0]))
        s = b.select(m, imm(splat(half_bits(shift[1], b.fmt))),
                     imm(splat(half_bits(shift[0], b.fmt))))
        return m, b.sub(xc, s)
    return m, xc


def select_pair(b: Builder, m: str, lo_v: float, hi_v: float) -> str:
    """Per-lane region coefficient: mask set -> hi-region value, else lo-region value."""
    return b.select(m, imm(splat(half_bits(hi_v, b.fmt))), imm(splat(half_bits(lo_v, b.fmt))))


def squarings(prog: dict) -> int:
    return int(prog["params"].get("squarings") or 0)


def square(b: Builder, h: str, n: int) -> str:
    """n packed squarings: q -> q^(2^n) (each one mul, rounded)."""
    for _ in range(n):
        h = b.mul(h, h)
    return h


def piecewise_value(b: Builder, prog: dict, m: str, u: str, held_back: int = 0) -> str:
    """Horner value q in region-local u, then the program's squarings p = q^(2^s) except
    the last `held_back` (a split block applies those later with `square`)."""
    lo_c, hi_c = prog["coeffs"]
    c = [select_pair(b, m, lo_v, hi_v) for lo_v, hi_v in zip(lo_c, hi_c)]
    h = c[-1]
    for k in range(len(c) - 2, -1, -1):
        h = b.fma(h, u, c[k])
    return square(b, h, squarings(prog) - held_back)


def piecewise_factored(b: Builder, grad: dict, m: str, u: str, P: str) -> str:
    """dy = P * g, g = a_r + b_r * u (params.g_squared: dy = P * (g * g))."""
    pr = grad["params"]
    a = select_pair(b, m, *pr["a"])
    bb = select_pair(b, m, *pr["b"])
    gv = b.fma(bb, u, a)
    if pr.get("g_squared"):
        gv = b.mul(gv, gv)
    return b.mul(P, gv)
