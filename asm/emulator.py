"""Bit-exact numpy emulator of the PTX subset our inline-asm blocks use.

``execute(text, inputs, n_out)`` runs the PTX *text* itself (the same string handed to
``llvm.inline_asm``), vectorised over numpy arrays.  Every register holds a ``uint32`` array
(a ``.b16`` register keeps its value in the low 16 bits; an f32 is its bit pattern).
Operands ``$0..$n_out-1`` are the outputs and ``$n_out..`` the inputs, as in LLVM's inline-asm
numbering.  Registers must be declared with ``.reg`` and written before they are read, so
generator typos fail here rather than in ptxas.  Anything outside the subset raises
``UnsupportedOp`` naming it.

Subset: mov/and/or/xor/not/shl/shr/lop3/prmt .b32; cvt.rn.{bf16x2,f16x2}.f32,
cvt.f32.{bf16,f16}; min/max/set.<cmp>.u32 and fma/mul/add/sub(.rn) on .bf16x2/.f16x2.
Numerics (single rounding, NaN and subnormal rules) live in ``fpbits``.
"""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from . import fpbits as fb


class UnsupportedOp(ValueError):
    """An instruction or operand form outside the emulated PTX subset."""


_IMM = re.compile(r"^(-?0[xX][0-9a-fA-F]+|-?\d+|0[fF][0-9a-fA-F]{8})$")
_REG_RANGE = re.compile(r"^([A-Za-z_%][\w%]*)<(\d+)>$")
_CMP = {
    "eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
}


def _imm(tok: str) -> np.uint32:
    if tok[:2] in ("0f", "0F"):
        return np.uint32(int(tok[2:], 16))
    return np.uint32(int(tok, 0) & 0xFFFFFFFF)


def statements(text: str) -> list[str]:
    """Instruction/declaration strings of an inline-asm block, braces and comments removed."""
    body = re.sub(r"//[^\n]*", "", text).strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    return [s.strip() for s in body.split(";") if s.strip()]


def split_operands(rest: str) -> list[str]:
    """'a, {b, c}, d' -> ['a', '{b, c}', 'd']."""
    out, depth, cur = [], 0, ""
    for ch in rest:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


class Machine:
    def __init__(self, inputs: Sequence[np.ndarray], n_out: int):
        self.n_out = n_out
        self.inputs = [np.asarray(x) for x in inputs]
        shape = np.broadcast_shapes(*(x.shape for x in self.inputs)) if inputs else ()
        self.inputs = [np.broadcast_to(_as_u32(x), shape) for x in self.inputs]
        self.shape = shape
        self.declared: set[str] = set()
        self.regs: dict[str, np.ndarray] = {}

    # ---- operands
    def declare(self, stmt: str) -> None:
        toks = stmt.replace(",", " ").split()
        for name in toks[2:]:
            m = _REG_RANGE.match(name)
            names = [f"{m.group(1)}{i}" for i in range(int(m.group(2)))] if m else [name]
            self.declared.update(names)

    def read(self, tok: str, imm_ok: bool) -> np.ndarray:
        if _IMM.match(tok):
            if not imm_ok:
                raise UnsupportedOp(f"immediate operand {tok!r} not allowed here")
            return np.full(self.shape, _imm(tok), np.uint32)
        if tok.startswith("$"):
            k = int(tok[1:])
            if k >= self.n_out:
                return self.inputs[k - self.n_out]
        elif tok not in self.declared:
            raise UnsupportedOp(f"register {tok!r} used but not declared")
        if tok not in self.regs:
            raise UnsupportedOp(f"register {tok!r} read before written")
        return self.regs[tok]

    def write(self, tok: str, val: np.ndarray) -> None:
        if tok.startswith("$"):
            if int(tok[1:]) >= self.n_out:
                raise UnsupportedOp(f"write to input operand {tok}")
        elif tok not in self.declared:
            raise UnsupportedOp(f"register {tok!r} written but not declared")
        self.regs[tok] = np.broadcast_to(np.asarray(val, np.uint32), self.shape).copy()

    # ---- one statement
    def step(self, stmt: str) -> None:
        if stmt.startswith(".reg"):
            return self.declare(stmt)
        if stmt.startswith("@"):
            raise UnsupportedOp(f"predicated instruction: {stmt!r}")
        opcode, _, rest = stmt.partition(" ")
        ops = split_operands(rest)
        parts = opcode.split(".")
        handler = _HANDLERS.get(parts[0])
        if handler is None:
            raise UnsupportedOp(f"unsupported PTX op {opcode!r}")
        handler(self, opcode, parts[1:], ops)


def _as_u32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.float32:
        return x.view(np.uint32)
    if x.dtype.kind == "f":
        raise TypeError("f32 inputs must be float32 arrays (their bits are the operand)")
    return (x.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)


def _need(opcode: str, mods: list[str], *allowed: tuple[str, ...]) -> None:
    if tuple(mods) not in allowed:
        raise UnsupportedOp(f"unsupported PTX op {opcode!r}")


def _srcs(m: Machine, ops: list[str], n: int, imm_ok: bool, opcode: str) -> list[np.ndarray]:
    if len(ops) != n + 1:
        raise UnsupportedOp(f"{opcode}: expected {n + 1} operands, got {ops}")
    return [m.read(t, imm_ok) for t in ops[1:]]


# ----------------------------------------------------------------------------- integer ops
def _bitwise(m, opcode, mods, ops):
    _need(opcode, mods, ("b32",), ("u32",), ("s32",))
    name = opcode.split(".")[0]
    if name == "not":
        (a,) = _srcs(m, ops, 1, True, opcode)
        return m.write(ops[0], ~a)
    a, b = _srcs(m, ops, 2, True, opcode)
    fn = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[name]
    m.write(ops[0], fn(a, b))


def _shift(m, opcode, mods, ops):
    _need(opcode, mods, ("b32",), ("u32",), ("s32",))
    a, b = _srcs(m, ops, 2, True, opcode)
    n = np.minimum(b, 32).astype(np.uint64)  # PTX clamps shift amounts above 32
    if opcode.startswith("shl"):
        out = (a.astype(np.uint64) << n) & 0xFFFFFFFF
    elif mods == ["s32"]:
        out = (a.view(np.int32).astype(np.int64) >> np.minimum(n, 31).astype(np.int64))
    else:
        out = a.astype(np.uint64) >> n
    m.write(ops[0], (out.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32))


def _mov(m, opcode, mods, ops):
    _need(opcode, mods, ("b32",), ("u32",), ("s32",))
    if len(ops) != 2:
        raise UnsupportedOp(f"{opcode}: expected 2 operands, got {ops}")
    dst, src = ops
    if dst.startswith("{"):               # unpack {lo, hi} <- b32
        lo, hi = split_operands(dst[1:-1])
        lo_v, hi_v = fb.lanes(m.read(src, True))
        m.write(lo, lo_v)
        return m.write(hi, hi_v)
    if src.startswith("{"):               # pack b32 <- {lo, hi}
        lo, hi = split_operands(src[1:-1])
        return m.write(dst, fb.pack(m.read(lo, False), m.read(hi, False)))
    m.write(dst, m.read(src, True))


def _lop3(m, opcode, mods, ops):
    _need(opcode, mods, ("b32",))
    if len(ops) != 5 or not _IMM.match(ops[4]):
        raise UnsupportedOp(f"{opcode}: needs d, a, b, c, immLut; got {ops}")
    a, b, c = (m.read(t, True) for t in ops[1:4])
    m.write(ops[0], fb.lop3(a, b, c, int(_imm(ops[4])) & 0xFF))


def _prmt(m, opcode, mods, ops):
    _need(opcode, mods, ("b32",))
    a, b, sel = _srcs(m, ops, 3, True, opcode)
    src = (b.astype(np.uint64) << 32) | a.astype(np.uint64)   # bytes 0-3 from a, 4-7 from b
    out = np.zeros(m.shape, np.uint64)
    for k in range(4):
        nib = (sel >> np.uint32(4 * k)) & 0xF
        byte = (src >> ((nib & 7).astype(np.uint64) * 8)) & 0xFF
        byte = np.where(nib & 8, np.where(byte & 0x80, 0xFF, 0), byte)  # sign replicate
        out |= byte.astype(np.uint64) << np.uint64(8 * k)
    m.write(ops[0], out.astype(np.uint32))


# ----------------------------------------------------------------------------- float ops
def _cvt(m, opcode, mods, ops):
    if mods in (["rn", "bf16x2", "f32"], ["rn", "f16x2", "f32"]):
        a, b = _srcs(m, ops, 2, False, opcode)     # a -> upper half, b -> lower half
        fmt = fb.FMTS[mods[1]]
        hi, lo = (fb.encode(fb.round_to_format(fb.f32_bits_to_f64(v), 0.0, fmt), fmt)
                  for v in (a, b))
        return m.write(ops[0], fb.pack(lo, hi))
    if mods in (["f32", "bf16"], ["f32", "f16"]):
        (h,) = _srcs(m, ops, 1, False, opcode)
        val = fb.decode(h & 0xFFFF, fb.FMTS[mods[1]]).astype(np.float32)
        return m.write(ops[0], val.view(np.uint32))
    raise UnsupportedOp(f"unsupported PTX op {opcode!r}")


def _packed_fmt(opcode: str, mods: list[str]) -> fb.Fmt:
    if not mods or mods[-1] not in ("bf16x2", "f16x2"):
        raise UnsupportedOp(f"unsupported PTX op {opcode!r}")
    return fb.FMTS[mods[-1]]


def _minmax(m, opcode, mods, ops):
    if len(mods) != 1:
        raise UnsupportedOp(f"unsupported PTX op {opcode!r}")   # .NaN/.ftz/.xorsign not emulated
    fmt = _packed_fmt(opcode, mods)
    a, b = _srcs(m, ops, 2, False, opcode)
    want_min = opcode.startswith("min")
    halves = []
    for k in (0, 1):
        ab, bb = fb.lanes(a)[k], fb.lanes(b)[k]
        av, bv = fb.decode(ab, fmt), fb.decode(bb, fmt)
        # IEEE minimumNumber/maximumNumber: a NaN operand loses, -0 < +0.
        a_first = np.where(want_min, av < bv, av > bv)
        zeros = (av == 0) & (bv == 0)
        a_neg = (ab & 0x8000) != 0
        a_first = np.where(zeros, a_neg if want_min else ~a_neg, a_first)
        out = np.where(a_first, ab, bb)
        out = np.where(np.isnan(av), bb, np.where(np.isnan(bv), ab, out))
        out = np.where(np.isnan(av) & np.isnan(bv), np.uint32(fmt.nan), out)
        halves.append(out)
    m.write(ops[0], fb.pack(*halves))


def _set(m, opcode, mods, ops):
    if len(mods) != 3 or mods[1] != "u32":
        raise UnsupportedOp(f"unsupported PTX op {opcode!r}")
    fmt = _packed_fmt(opcode, mods)
    cmp, unordered = mods[0], False
    if cmp in ("equ", "neu", "ltu", "leu", "gtu", "geu"):
        cmp, unordered = cmp[:-1], True
    if cmp not in _CMP and cmp not in ("num", "nan"):
        raise UnsupportedOp(f"unsupported PTX op {opcode!r}")
    a, b = _srcs(m, ops, 2, False, opcode)
    halves = []
    for k in (0, 1):
        av, bv = fb.decode(fb.lanes(a)[k], fmt), fb.decode(fb.lanes(b)[k], fmt)
        nan = np.isnan(av) | np.isnan(bv)
        if cmp == "num":
            t = ~nan
        elif cmp == "nan":
            t = nan
        else:
            t = np.where(nan, unordered, _CMP[cmp](av, bv))
        halves.append(np.where(t, np.uint32(0xFFFF), np.uint32(0)))
    m.write(ops[0], fb.pack(*halves))


def _arith_f32(m, opcode, mods, ops):
    """fma/mul/add/sub.rn.f32 (no .ftz: subnormals kept), one rounding; immediates allowed."""
    if mods != ["rn", "f32"]:
        raise UnsupportedOp(f"unsupported PTX op {opcode!r}")
    name = opcode.split(".")[0]
    srcs = [fb.f32_bits_to_f64(w) for w in _srcs(m, ops, 3 if name == "fma" else 2, True, opcode)]
    with np.errstate(invalid="ignore", over="ignore"):
        if name == "fma":
            val = fb.fma_exact(*srcs, fb.F32)            # 24 x 24 bits: the product is exact in f64
        elif name == "mul":
            val = fb.round_to_format(srcs[0] * srcs[1], 0.0, fb.F32)
        else:
            val = fb.round_to_format(*fb.two_sum(srcs[0], srcs[1] if name == "add" else -srcs[1]), fb.F32)
    # a NaN result is the GPU's one canonical FP32 NaN, 0x7FFFFFFF (no payload, no sign), not
    # numpy's 0x7FC00000: the bits matter where a block reads a float as an integer (the exp2
    # block's exponent add turns it into FLT_MAX)
    m.write(ops[0], np.where(np.isnan(val), np.uint32(0x7FFFFFFF), val.astype(np.float32).view(np.uint32)))


def _mad(m, opcode, mods, ops):
    """mad.lo.{s32,u32}: the low 32 bits of a * b + c."""
    _need(opcode, mods, ("lo", "s32"), ("lo", "u32"))
    a, b, c = (x.astype(np.uint64) for x in _srcs(m, ops, 3, True, opcode))
    m.write(ops[0], ((a * b + c) & 0xFFFFFFFF).astype(np.uint32))


def _arith(m, opcode, mods, ops):
    """fma/mul/add/sub on packed 16-bit floats, one rounding (.rn is the default)."""
    if mods and mods[-1] == "f32":
        return _arith_f32(m, opcode, mods, ops)
    fmt = _packed_fmt(opcode, mods)
    if mods[:-1] not in ([], ["rn"]):
        raise UnsupportedOp(f"unsupported PTX op {opcode!r}")     # .ftz/.sat/.relu
    name = opcode.split(".")[0]
    n_src = 3 if name == "fma" else 2
    srcs = _srcs(m, ops, n_src, False, opcode)
    if name == "fma":
        fn = lambda a, b, c: fb.fma_exact(a, b, c, fmt)
    elif name == "mul":
        fn = lambda a, b: fb.round_to_format(a * b, 0.0, fmt)     # product exact in f64
    elif name == "add":
        fn = lambda a, b: fb.round_to_format(*fb.two_sum(a, b), fmt)
    else:
        fn = lambda a, b: fb.round_to_format(*fb.two_sum(a, -b), fmt)
    with np.errstate(invalid="ignore", over="ignore"):
        m.write(ops[0], fb.per_lane(fn, fmt, *srcs))


_HANDLERS = {
    "mov": _mov, "and": _bitwise, "or": _bitwise, "xor": _bitwise, "not": _bitwise,
    "shl": _shift, "shr": _shift, "lop3": _lop3, "prmt": _prmt, "cvt": _cvt,
    "min": _minmax, "max": _minmax, "set": _set,
    "fma": _arith, "mul": _arith, "add": _arith, "sub": _arith, "mad": _mad,
}


# ----------------------------------------------------------------------------- entry points
def execute(text: str, inputs: Sequence[np.ndarray], n_out: int) -> list[np.ndarray]:
    """Run an inline-asm block; inputs are uint32 words or float32 arrays (f32 operands)."""
    m = Machine(inputs, n_out)
    for stmt in statements(text):
        m.step(stmt)
    missing = [f"${k}" for k in range(n_out) if f"${k}" not in m.regs]
    if missing:
        raise UnsupportedOp(f"outputs never written: {missing}")
    return [m.regs[f"${k}"] for k in range(n_out)]


def run_block(block, *inputs) -> list[np.ndarray]:
    """Run an ``asm.blocks.PtxBlock`` (its asm_text) on numpy inputs; returns uint32 words."""
    if len(inputs) != len(block.in_types):
        raise ValueError(f"{block.name} takes {len(block.in_types)} inputs")
    vals = []
    for x, t in zip(inputs, block.in_types):
        x = np.asarray(x)
        vals.append(x.astype(np.float32) if t == "f32" and x.dtype.kind == "f" else x)
    return execute(block.asm_text(), vals, len(block.out_types))


def instruction_lines(text: str) -> list[str]:
    """The instructions of a block (declarations dropped)."""
    return [s for s in statements(text) if not s.startswith(".reg")]
