"""PTX inline-asm blocks generated from the coefficient table (flash_attn_poly/data/programs.json).

``block_for(spec, role) -> PtxBlock``: block ``role`` of a program (asm/programs.ProgramSpec),
built from the program's form, so every entry of a known form has its blocks by its name
alone.  ``get_block(name, table=None)``: the named blocks (BUILDERS: the CLI, the elementwise
kernels, tests).  Operands: outputs ``$0..``, then inputs; lane 0 is the low 16 bits and comes
from the first input.  Each block evaluates its program(s) in the op order of
``fit/runtime.py`` so ``fit.runtime.replay(..., "fused")`` predicts its bits.
Pure Python: no cutlass import (``cute_ops.py`` wraps these for CuTe DSL kernels).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from . import ptxgen as g
from .programs import ProgramSpec, entry, load_table, spec

SIGMOID_D3 = "sigmoid_d3"          # B1/B4 SiLU, SwiGLU and the sigmoid_bf16x2 block
# GeGLU (Gemma-2's gelu_pytorch_tanh MLP): the BF16 D4 GELU value and direct-derivative programs.
# They are fitted to the erf GELU; gelu_pytorch_tanh differs from it by at most 4.7e-4 in value
# and 8.7e-4 in derivative, 3-5% of the programs' own max abs error (0.0149 / 0.0195 over every
# BF16 input), so one pair of programs serves both (tests/test_elementwise_cpu.py measures it).
GELU_D4, GELU_D4_GRAD = "gelu_d4", "gelu_d4_grad"
SIGMOID_ATTN = "sigmoid_attn_n4096"  # B3 (with "_grad" for the coupled block)
SIGMOID_ATTN_F16 = "sigmoid_attn_n4096_f16"   # f16x2 D4 variant
# B2: the residual rho(u) = u - tanh(u) that runtime.softcap_logit combines as
# fma.rn.f32(-c, rho, xc); "_grad" is the differentiated D3 (dtanh/du = 1 - rho').
SOFTCAP = "softcap_c50"
EXP2 = "exp2_f32_d3"               # FP32 2^a (fit/exp2.py): the softcap stage's exp2 offload
F16_FUNCTIONS = ("sigmoid", "tanh", "silu", "gelu")
F16_DEGREES = (3, 4, 5, 6)
F16_DEFAULT_DEGREE = 4               # the seed's standalone sweep uses D4 derivative programs


@dataclass(frozen=True)
class PtxBlock:
    name: str
    in_types: tuple[str, ...]      # "f32" or "b32" (packed pair) per input
    out_types: tuple[str, ...]     # "b32" per output
    lines: tuple[str, ...]         # one PTX instruction per entry, no trailing ';'
    regs: tuple[str, ...] = ()     # b32 temporaries declared by asm_text
    programs: tuple[str, ...] = field(default=())   # table entries the block was built from

    def asm_text(self) -> str:
        decl = f".reg .b32 {', '.join(self.regs)};\n" if self.regs else ""
        return "{\n" + decl + "".join(f"{ln};\n" for ln in self.lines) + "}"

    def constraints(self) -> str:
        ins = ["f" if t == "f32" else "r" for t in self.in_types]
        return ",".join(["=r"] * len(self.out_types) + ins)

    @property
    def n_instructions(self) -> int:
        return len(self.lines)

    @property
    def n_fma(self) -> int:
        return sum(ln.startswith("fma.") for ln in self.lines)


# ----------------------------------------------------------------------------- finishing
def finish(name, b: g.Builder, in_types, results, programs) -> PtxBlock:
    """Copy each result into its output operand with a final ``mov.b32 $k, r``.

    Why: outputs are then written exactly once, after every input has been read and no
    instruction reads an output operand, so the block stays correct even if a caller's
    constraints let an output share an input's register (tied/"+r" operands).  ptxas
    coalesces these copies (the SASS has no extra MOV), and with them the B3 blocks land on
    the seed's counts: 16 + 1 = 17 (forward) and 20 + 2 = 22 (coupled).
    """
    lines = list(b.lines) + [f"mov.b32 ${k}, {r}" for k, r in enumerate(results)]
    regs = tuple(f"r{i}" for i in range(b.n_regs))
    return PtxBlock(name, tuple(in_types), ("b32",) * len(results), tuple(lines), regs,
                    tuple(programs))


def finish_direct(name, b: g.Builder, in_types, results, programs) -> PtxBlock:
    """Rename each result register to its output operand (no trailing mov).

    Safe because the B3 blocks read their inputs only in the first instruction (the
    cvt.rn.bf16x2.f32): every output is written after every input has been read, so an
    output sharing an input's register cannot corrupt the block (checked here).  Every
    instruction of the block then does real work (the 17/22 counts have no copies)."""
    n_out = len(results)
    ins = tuple(f"${n_out + i}" for i in range(len(in_types)))
    ren = {r: f"${k}" for k, r in enumerate(results)}
    if len(set(results)) != n_out:
        raise ValueError(f"{name}: two outputs share one register")
    lines, first_write = [], None
    for i, ln in enumerate(b.lines):
        op, rest = ln.split(" ", 1)
        ops = [ren.get(t, t) for t in (x.strip() for x in rest.split(","))]
        # an instruction may read an input and write an output (reads come first)
        if first_write is not None and any(t in ins for t in ops[1:]):
            raise ValueError(f"{name}: input read after an output write: {ln}")
        if ops[0].startswith("$") and first_write is None:
            first_write = i
        lines.append(f"{op} {', '.join(ops)}")
    regs = tuple(f"r{i}" for i in range(b.n_regs) if f"r{i}" not in ren)
    return PtxBlock(name, tuple(in_types), ("b32",) * n_out, tuple(lines), regs, tuple(programs))


def inputs(n_out: int, n_in: int) -> list[str]:
    return [f"${n_out + i}" for i in range(n_in)]


# ----------------------------------------------------------------------------- block builders
def _packed_input(b: g.Builder, in_types, ins) -> str:
    """The packed operand: cvt.rn of two f32 inputs, or the b32 input itself."""
    return b.cvt_pack(ins[0], ins[1]) if in_types[0] == "f32" else ins[0]


def _lane_wise(name: str, spec: ProgramSpec, in_f32: bool) -> PtxBlock:
    """One program applied lane-wise (forms of ptxgen.FORMS), on two f32 inputs or one pair."""
    prog = spec.entry()
    in_types = ("f32", "f32") if in_f32 else ("b32",)
    b = g.Builder(spec.packed_type)
    x = _packed_input(b, in_types, inputs(1, len(in_types)))
    return finish(name, b, in_types, [g.FORMS[spec.form](b, prog, x)], [spec.name])


SHARED_KEYS = ("lo", "hi", "thr", "shift", "squarings")


def _check_shared(fwd: dict, grad: dict) -> None:
    """The coupled block reuses clamp, mask, u and Horner value: the table must agree."""
    bad = [k for k in SHARED_KEYS if fwd["params"].get(k) != grad["params"].get(k)]
    if fwd["coeffs"] != grad["coeffs"]:
        bad.append("coeffs")
    if bad:
        raise ValueError(f"sigmoid_attn forward/grad programs disagree on {bad}")


def _piecewise(name: str, spec: ProgramSpec, with_grad: bool) -> PtxBlock:
    """A piecewise2 program (sigmoid attention) on two f32 inputs; with_grad: the coupled
    block, P and the factored derivative surrogate of `<name>_grad` (seed B3)."""
    fwd = spec.entry()
    b = g.Builder(spec.packed_type)
    n_out = 2 if with_grad else 1
    xb = b.cvt_pack(*inputs(n_out, 2))
    m, u = g.piecewise_front(b, fwd, xb)
    P = g.piecewise_value(b, fwd, m, u)
    if not with_grad:
        return finish_direct(name, b, ("f32", "f32"), [P], [spec.name])
    grad = spec.grad.entry()
    _check_shared(fwd, grad)
    dy = g.piecewise_factored(b, grad, m, u, P)
    return finish_direct(name, b, ("f32", "f32"), [P, dy], [spec.name, spec.grad.name])


def _piecewise_part(name: str, spec: ProgramSpec, part: str) -> PtxBlock:
    """The forward block cut before its last squaring, for a caller that must define P
    later than the rest (attn_fwd overlap_v2: P is a wgmma A operand, and defining it while
    the previous P V is in flight serialises every wgmma, ptxas C7513).
    head: the forward block less its last squaring; in 2 f32 scores, out q^(2^(s-1)) packed.
    tail: that last squaring alone; in the head's word, out P.  Both come from
    piecewise_value/square, the code of the full block: head then tail is the full block
    instruction for instruction (16 + 1 = 17 with the committed table), bit for bit."""
    fwd = spec.entry()
    b = g.Builder(spec.packed_type)
    if part == "tail":
        (q,) = inputs(1, 1)
        return finish_direct(name, b, ("b32",), [g.square(b, q, 1)], [spec.name])
    xb = b.cvt_pack(*inputs(1, 2))
    m, u = g.piecewise_front(b, fwd, xb)
    q = g.piecewise_value(b, fwd, m, u, held_back=1)
    return finish_direct(name, b, ("f32", "f32"), [q], [spec.name])


def _exp2_f32(name: str, spec: ProgramSpec) -> PtxBlock:
    """2^a in FP32 (form exp2_f32, fit/exp2.py): t = a + 1.5*2^23, j = t - 1.5*2^23, f = a - j,
    p = Horner of the coefficients by fma.rn.f32, then j << 23 added to p's bits by one
    mad.lo.s32 on t's bits.  In one FP32 score, out the FP32 result's bits."""
    imm = lambda bits: "0f" + bits[2:].upper()          # coeffs_bits "0x3f7ffb49" -> 0f3F7FFB49
    magic = "0f4B400000"                                  # 1.5 * 2^23
    c = [imm(x) for x in spec.coeff_bits]
    (a,) = inputs(1, 1)
    b = g.Builder("f16x2")                                # registers only; no packed op emitted
    t = b.emit("add.rn.f32", a, magic)
    j = b.emit("sub.rn.f32", t, magic)
    f = b.emit("sub.rn.f32", a, j)
    p = b.emit("fma.rn.f32", f, c[-1], c[-2])
    for k in range(len(c) - 3, -1, -1):
        p = b.emit("fma.rn.f32", p, f, c[k])
    return finish(name, b, ("f32",), [b.emit("mad.lo.s32", t, "8388608", p)], [spec.name])


def block_for(spec: ProgramSpec, role: str, name: str | None = None) -> PtxBlock:
    """Block ``role`` (asm.programs.ROLES) of program ``spec``, built from the spec's form
    alone: any table entry of a known form has its blocks, whatever its name.  name: the
    block's name (default "<program>:<role>"; it is not part of the PTX text)."""
    if role not in spec.roles:
        raise ValueError(f"program {spec.name!r} (form {spec.form!r}) has no {role!r} block; "
                         f"its blocks: {spec.roles}")
    name = name or f"{spec.name}:{role}"
    if role == "fwd" and spec.form in g.FORMS:
        return _lane_wise(name, spec, in_f32=True)
    if role == "packed":
        return _lane_wise(name, spec, in_f32=False)
    if role == "bwd":
        return _lane_wise(name, spec.grad, in_f32=True)
    if role in ("fwd", "fwd_bwd"):
        return _piecewise(name, spec, with_grad=role == "fwd_bwd")
    if role in ("head", "tail"):
        return _piecewise_part(name, spec, role)
    return _exp2_f32(name, spec)


# ----------------------------------------------------------------------------- named blocks
def _sigmoid_p(b: g.Builder, table, x: str) -> str:
    """The SiLU blocks' sigmoid: the D3 program inside its clamp, exactly 0 / 1 beyond it
    (ptxgen.odd's tail: the program's own value there, 2^-8 from them, made SiLU's error and
    its backward rule grow linearly with |x|)."""
    return g.odd(b, entry(SIGMOID_D3, table), x, limit=1.0)


def _silu_grad(b: g.Builder, p: str, s: str) -> str:
    """p + s * (1 - p) with s = x * p (seed B1/B4 backward rule), two roundings."""
    one_minus_p = b.sub(b.value(1.0), p)
    return b.fma(s, one_minus_p, p)


def silu_fwd(table):
    b = g.Builder("bf16x2")
    (x,) = inputs(1, 1)
    return finish("silu_fwd_bf16x2", b, ("b32",), [b.mul(x, _sigmoid_p(b, table, x))],
                  [SIGMOID_D3])


def silu_bwd(table):
    b = g.Builder("bf16x2")
    (x,) = inputs(1, 1)
    p = _sigmoid_p(b, table, x)
    return finish("silu_bwd_bf16x2", b, ("b32",), [_silu_grad(b, p, b.mul(x, p))],
                  [SIGMOID_D3])


def swiglu_fwd(table):
    """silu(gate) * up."""
    b = g.Builder("bf16x2")
    gate, up = inputs(1, 2)
    s = b.mul(gate, _sigmoid_p(b, table, gate))
    return finish("swiglu_fwd_bf16x2", b, ("b32", "b32"), [b.mul(s, up)], [SIGMOID_D3])


def swiglu_bwd(table):
    """Inputs gate, up, dy; outputs d_gate = dy*up*silu'(gate), d_up = dy*silu(gate)."""
    b = g.Builder("bf16x2")
    gate, up, dy = inputs(2, 3)
    p = _sigmoid_p(b, table, gate)
    s = b.mul(gate, p)
    d_up = b.mul(dy, s)
    d_gate = b.mul(b.mul(dy, up), _silu_grad(b, p, s))
    return finish("swiglu_bwd_bf16x2", b, ("b32", "b32", "b32"), [d_gate, d_up], [SIGMOID_D3])


def _gelu(b: g.Builder, table, x: str, grad: bool = False) -> str:
    prog = entry(GELU_D4_GRAD if grad else GELU_D4, table)
    return g.FORMS[prog["form"]](b, prog, x)


def geglu_fwd(table):
    """gelu(gate) * up."""
    b = g.Builder("bf16x2")
    gate, up = inputs(1, 2)
    return finish("geglu_fwd_bf16x2", b, ("b32", "b32"), [b.mul(_gelu(b, table, gate), up)],
                  [GELU_D4])


def geglu_bwd(table):
    """Inputs gate, up, dy; outputs d_gate = (dy*up)*gelu'(gate), d_up = dy*gelu(gate): the value
    and the directly fitted derivative are two programs (no shared intermediate to reuse)."""
    b = g.Builder("bf16x2")
    gate, up, dy = inputs(2, 3)
    d_up = b.mul(dy, _gelu(b, table, gate))
    d_gate = b.mul(b.mul(dy, up), _gelu(b, table, gate, grad=True))
    return finish("geglu_bwd_bf16x2", b, ("b32", "b32", "b32"), [d_gate, d_up],
                  [GELU_D4, GELU_D4_GRAD])


def _f16_program(table: dict, fn: str, degree: int, grad: bool) -> str:
    """Name of the FP16 program for fn: '<fn>_d<D>[_grad]_f16' or a '<fn>_d<D>[_grad]' entry
    whose dtype is f16."""
    base = f"{fn}_d{degree}" + ("_grad" if grad else "")
    for cand in (base + "_f16", f"{fn}_f16_d{degree}" + ("_grad" if grad else ""), base):
        prog = table["programs"].get(cand)
        if prog is not None and prog.get("dtype") == "f16":
            return cand
    raise KeyError(f"no f16 program for {base} in the coefficient table")


def f16_block(fn: str, direction: str, degree: int):
    name = f"{fn}_{direction}_f16x2" + ("" if degree == F16_DEFAULT_DEGREE else f"_d{degree}")

    def build(table):
        prog_name = _f16_program(table, fn, degree, direction == "bwd")
        return block_for(spec(prog_name, table), "packed", name)
    return name, build


def alias(name: str, prog_name: str, role: str):
    """A block reachable by name: block ``role`` of the table's program ``prog_name``."""
    return lambda table: block_for(spec(prog_name, table), role, name)


# Named blocks (the CLI, the elementwise kernels, tests).  The attention kernels do not need
# these names: they build block_for(spec, role) from their program's spec.
BUILDERS = {
    "sigmoid_fwd": alias("sigmoid_fwd", SIGMOID_ATTN, "fwd"),
    "sigmoid_fwd_bwd": alias("sigmoid_fwd_bwd", SIGMOID_ATTN, "fwd_bwd"),
    "sigmoid_attn_fwd_f16x2": alias("sigmoid_attn_fwd_f16x2", SIGMOID_ATTN_F16, "fwd"),
    "sigmoid_fwd_head": alias("sigmoid_fwd_head", SIGMOID_ATTN, "head"),
    "sigmoid_attn_fwd_f16x2_head": alias("sigmoid_attn_fwd_f16x2_head", SIGMOID_ATTN_F16, "head"),
    "sigmoid_attn_fwd_f16x2_tail": alias("sigmoid_attn_fwd_f16x2_tail", SIGMOID_ATTN_F16, "tail"),
    "sigmoid_fwd_tail": alias("sigmoid_fwd_tail", SIGMOID_ATTN, "tail"),
    "softcap_fwd": alias("softcap_fwd", SOFTCAP, "fwd"),
    "softcap_bwd": alias("softcap_bwd", SOFTCAP, "bwd"),
    # FP16 D5 softcap residual
    "softcap_fwd_f16x2": alias("softcap_fwd_f16x2", SOFTCAP + "_f16", "fwd"),
    "softcap_bwd_f16x2": alias("softcap_bwd_f16x2", SOFTCAP + "_f16", "bwd"),
    # odd polynomial in u^2, clamp outside the block (fit/softcap_odd.py)
    "softcap_fwd_f16x2_odd": alias("softcap_fwd_f16x2_odd", SOFTCAP + "_f16_odd", "fwd"),
    # the two-region FP16 softcap (fit/softcap_tail.py): residual below |u| = 1, 1 - tanh above
    "softcap_fwd_f16x2_tail": alias("softcap_fwd_f16x2_tail", SOFTCAP + "_f16_tail", "fwd"),
    "softcap_bwd_f16x2_tail": alias("softcap_bwd_f16x2_tail", SOFTCAP + "_f16_tail", "bwd"),
    "sigmoid_bf16x2": alias("sigmoid_bf16x2", SIGMOID_D3, "packed"),
    "exp2_f32": alias("exp2_f32", EXP2, "exp2"),
    "silu_fwd_bf16x2": silu_fwd,
    "silu_bwd_bf16x2": silu_bwd,
    "swiglu_fwd_bf16x2": swiglu_fwd,
    "swiglu_bwd_bf16x2": swiglu_bwd,
    "geglu_fwd_bf16x2": geglu_fwd,
    "geglu_bwd_bf16x2": geglu_bwd,
}
for _fn in F16_FUNCTIONS:
    for _dir in ("fwd", "bwd"):
        for _deg in F16_DEGREES:
            _name, _build = f16_block(_fn, _dir, _deg)
            BUILDERS[_name] = _build

# Parts of a main block (head + tail = sigmoid_fwd): reachable by name, tested against it.
PART_BLOCKS = ("sigmoid_fwd_head", "sigmoid_fwd_tail", "sigmoid_attn_fwd_f16x2_head",
               "sigmoid_attn_fwd_f16x2_tail")

# Blocks listed by `python -m flash_attn_poly.asm count` (the per-degree f16 variants are
# reachable by name for the sweeps).
MAIN_BLOCKS = tuple(n for n in BUILDERS if not re.search(r"_d\d$", n) and n not in PART_BLOCKS)


def get_block(name: str, table: dict | None = None) -> PtxBlock:
    """Build named block ``name`` from ``table`` (default: the committed programs.json)."""
    if name not in BUILDERS:
        raise KeyError(f"unknown block {name!r}; known: {sorted(BUILDERS)}")
    return BUILDERS[name](load_table() if table is None else table)
