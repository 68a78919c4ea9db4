"""Exact bit-level numerics behind the PTX emulator: 16-bit float formats, single-rounding
FMA, lane packing, lop3.

Arithmetic on packed 16-bit floats rounds exactly once (round to nearest even):
a*b of two bf16 (8-bit significands) or f16 (11-bit) values is exact in float64, and the
addend is folded in with TwoSum, so ``hi + lo`` is the exact sum; the final rounding looks at
``lo`` only when ``hi`` sits exactly on a tie (see ``round_to_format``).  Subnormals are kept
(no .ftz in any op we emit), overflow goes to infinity, NaN results are the canonical 0x7FFF.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fmt:
    name: str
    p: int        # significand bits including the implicit one
    emin: int     # exponent of the smallest normal
    emax: int     # exponent of the largest finite

    @property
    def nan(self) -> int:
        return 0x7FFF  # canonical NaN of both cuda_bf16.h and cuda_fp16.h


BF16 = Fmt("bf16", 8, -126, 127)
F16 = Fmt("f16", 11, -14, 15)
F32 = Fmt("f32", 24, -126, 127)   # scalar FP32 ops (the exp2_f32 block)
FMTS = {"bf16x2": BF16, "f16x2": F16, "bf16": BF16, "f16": F16}
M32 = np.uint32(0xFFFFFFFF)


# ----------------------------------------------------------------------------- conversions
def decode(bits: np.ndarray, fmt: Fmt) -> np.ndarray:
    """16-bit patterns -> exact float64 values."""
    b = np.asarray(bits).astype(np.uint32) & 0xFFFF
    with np.errstate(invalid="ignore"):         # NaN patterns are legitimate inputs
        if fmt is BF16:
            return (b << 16).view(np.float32).astype(np.float64)
        return b.astype(np.uint16).view(np.float16).astype(np.float64)


def encode(x: np.ndarray, fmt: Fmt) -> np.ndarray:
    """float64 values already representable in ``fmt`` -> uint32 holding the 16-bit pattern."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if fmt is BF16:
            out = x.astype(np.float32).view(np.uint32) >> 16
        else:
            out = x.astype(np.float16).view(np.uint16).astype(np.uint32)
    return np.where(np.isnan(x), np.uint32(fmt.nan), out).astype(np.uint32)


def round_to_format(hi: np.ndarray, lo: np.ndarray, fmt: Fmt) -> np.ndarray:
    """RNE of the exact value hi + lo (|lo| <= half an f64 ulp of hi) to ``fmt``, as float64.

    hi is the f64 nearest to the exact value, so both lie on the same side of every
    format tie point (tie points are f64 numbers); only when hi *is* a tie does lo decide.
    """
    hi = np.asarray(hi, np.float64)
    lo = np.broadcast_to(np.asarray(lo, np.float64), hi.shape)
    ax = np.abs(hi)
    finite = np.isfinite(ax) & (ax > 0)
    _, e = np.frexp(np.where(finite, ax, 1.0))           # ax = m * 2**e, m in [0.5, 1)
    quantum = np.ldexp(1.0, np.maximum(e - 1, fmt.emin) - (fmt.p - 1))
    with np.errstate(invalid="ignore"):                   # inf/NaN lanes are masked below
        r = ax / quantum                                  # exact: power-of-two scaling
        fl = np.floor(r)
        n = np.rint(r)                                    # ties to even
        tie = (r - fl) == 0.5
    toward = np.sign(lo) * np.sign(hi)                    # +1: exact |value| above the tie
    n = np.where(tie & (toward > 0), fl + 1, np.where(tie & (toward < 0), fl, n))
    with np.errstate(invalid="ignore"):
        mag = n * quantum
        mag = np.where(mag >= np.ldexp(1.0, fmt.emax + 1), np.inf, mag)
    return np.where(finite, np.copysign(mag, hi), hi)


def two_sum(a: np.ndarray, b: np.ndarray):
    """s + e == a + b exactly (Knuth), e = 0 where s is not finite."""
    with np.errstate(invalid="ignore", over="ignore"):
        s = a + b
        bb = s - a
        e = (a - (s - bb)) + (b - bb)
    return s, np.where(np.isfinite(s), e, 0.0)


def fma_exact(a: np.ndarray, b: np.ndarray, c: np.ndarray, fmt: Fmt) -> np.ndarray:
    """round(a*b + c) once; a, b, c exact float64 values of ``fmt`` numbers."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = a * b                                         # <= 22 significant bits: exact
    s, e = two_sum(p, c)
    return round_to_format(s, e, fmt)


# ----------------------------------------------------------------------------- lane helpers
def lanes(w: np.ndarray):
    return w & np.uint32(0xFFFF), w >> np.uint32(16)


def pack(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return ((hi.astype(np.uint32) & 0xFFFF) << np.uint32(16)) | (lo.astype(np.uint32) & 0xFFFF)


def per_lane(fn, fmt: Fmt, *words):
    """Apply fn(float64 lane values...) -> float64 on both lanes and repack."""
    outs = []
    for k in (0, 1):
        vals = [decode(lanes(w)[k], fmt) for w in words]
        outs.append(encode(fn(*vals), fmt))
    return pack(*outs)


def f32_bits_to_f64(w: np.ndarray) -> np.ndarray:
    return np.asarray(w, np.uint32).view(np.float32).astype(np.float64)


def lop3(a, b, c, lut: int) -> np.ndarray:
    """Bitwise f(a,b,c) for the 8-bit truth table lut (index = a<<2 | b<<1 | c)."""
    out = np.zeros_like(a)
    for idx in range(8):
        if (lut >> idx) & 1:
            ta = a if idx & 4 else ~a
            tb = b if idx & 2 else ~b
            tc = c if idx & 1 else ~c
            out |= ta & tb & tc
    return out
