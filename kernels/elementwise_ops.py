"""Device-side packed-pair evaluators for ``kernels/elementwise.py``.

Every evaluator maps packed 32-bit words (two BF16 or FP16 lanes each, lane 0 in the
low half) to packed words, so the streaming kernel is the same for every kind:

| kind         | inputs           | outputs            |
|--------------|------------------|--------------------|
| silu_fwd     | x                | y = silu(x)        |
| silu_bwd     | x, g             | dx                 |
| swiglu_fwd   | gate, up         | y = silu(gate)*up  |
| swiglu_bwd   | gate, up, g      | d_gate, d_up       |
| <fn>_fwd     | x                | y (FP16 sweep)     |
| <fn>_bwd     | x, g             | dx = g*f'(x)       |

``poly``: the packed polynomial blocks (fma.rn.{bf16,f16}x2, no MUFU).
``native``: the same word-in/word-out interface on the SFU: unpack to FP32,
sigma(v) = 0.5 + 0.5*tanh.approx(v/2) (one MUFU.TANH per element, the cheapest SFU
sigmoid), FP32 arithmetic, one cvt.rn to 16 bits at the end -- torch's recipe, so a
poly/native comparison isolates the evaluator.
"""
from __future__ import annotations

from cutlass import Uint32
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from flash_attn_poly.kernels import elementwise_standin as standin

# kind -> (number of packed inputs, number of packed outputs)
ARITY = {"silu_fwd": (1, 1), "silu_bwd": (2, 1), "swiglu_fwd": (2, 1), "swiglu_bwd": (3, 2)}
SWEEP_FNS = ("sigmoid", "tanh", "silu", "gelu")
for _fn in SWEEP_FNS:
    ARITY[f"{_fn}_fwd"] = (1, 1)
    ARITY[f"{_fn}_bwd"] = (2, 1)
BF16_KINDS = ("silu_fwd", "silu_bwd", "swiglu_fwd", "swiglu_bwd")


@dsl_user_op
def run_ptx(text: str, constraints: str, n_out: int, *values, loc=None, ip=None):
    """Inline one PTX block on packed words; returns a tuple of ``n_out`` Uint32."""
    operands = [Uint32(v).ir_value(loc=loc, ip=ip) for v in values]
    ret = T.i32() if n_out == 1 else llvm.StructType.get_literal([T.i32()] * n_out)
    res = llvm.inline_asm(ret, operands, text, constraints, has_side_effects=False,
                          is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                          loc=loc, ip=ip)
    if n_out == 1:
        return (Uint32(res),)
    return tuple(Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip))
                 for i in range(n_out))


# ---- poly blocks ----------------------------------------------------------------------

def block_name(kind: str, dtype: str) -> str:
    return f"{kind}_{'bf16x2' if dtype == 'bf16' else 'f16x2'}"


def poly_block(kind: str, dtype: str) -> tuple[str, str, int, tuple]:
    """(PTX, constraints, n_out, program dicts) of the packed polynomial block for `kind`.

    From asm/blocks.py when the coefficient table exists; otherwise (TEMPORARY) from
    kernels/elementwise_standin.py.  Backward blocks of (x, g) kinds return f'(x); the
    kernel multiplies by g (GRAD_MUL)."""
    name = block_name(kind, dtype)
    try:
        from flash_attn_poly.asm import blocks
        blk = blocks.get_block(name)
        table = blocks.load_table()
        progs = tuple(blocks.program(table, p) for p in blk.programs)
        return blk.asm_text(), blk.constraints(), len(blk.out_types), progs
    except (ImportError, FileNotFoundError, KeyError):
        text, cons, n_out = standin.block_text(name)
        prog = "sigmoid_d3" if dtype == "bf16" else (
            f"{kind.split('_')[0]}_d4" + ("_grad" if kind.endswith("_bwd") else ""))
        return text, cons, n_out, (standin.program(prog),)


def grad_mul(kind: str, dtype: str, evaluator: str) -> str | None:
    """PTX of the packed g * f'(x) step for (x, g) kinds with a poly block, else None."""
    if evaluator == "poly" and ARITY[kind] == (2, 1) and kind != "swiglu_fwd":
        return f"mul.rn.{'bf16x2' if dtype == 'bf16' else 'f16x2'} $0, $1, $2;"
    return None


# ---- native (SFU) blocks --------------------------------------------------------------

def _unpack(word: str, lo: str, hi: str, dtype: str) -> list[str]:
    if dtype == "bf16":  # a bf16 is the top half of an f32: shifts, no conversion
        return [f"shl.b32 {lo}, {word}, 16;", f"and.b32 {hi}, {word}, 0xffff0000;"]
    return [f"mov.b32 {{%hl, %hh}}, {word};", f"cvt.f32.f16 {lo}, %hl;",
            f"cvt.f32.f16 {hi}, %hh;"]


def _pack(out: str, lo: str, hi: str, dtype: str) -> str:
    # cvt.rn.{bf16x2,f16x2}.f32 d, a, b puts a in the upper lane.
    return f"cvt.rn.{'bf16x2' if dtype == 'bf16' else 'f16x2'}.f32 {out}, {hi}, {lo};"


def _sigmoid_f32(v: str, s: str) -> list[str]:
    """s = 0.5 + 0.5*tanh(v/2): one MUFU.TANH."""
    return [f"mul.f32 {s}, {v}, 0f3F000000;", f"tanh.approx.f32 {s}, {s};",
            f"fma.rn.f32 {s}, {s}, 0f3F000000, 0f3F000000;"]


def _native_lane(kind: str, v: list[str], outs: list[str]) -> list[str]:
    """FP32 lines for one lane; v = FP32 input registers, outs = FP32 result registers."""
    lines = _sigmoid_f32(v[0], "%s")
    if kind == "silu_fwd":
        return lines + [f"mul.f32 {outs[0]}, {v[0]}, %s;"]
    if kind == "swiglu_fwd":
        return lines + ["mul.f32 %t, %s, " + v[0] + ";", f"mul.f32 {outs[0]}, %t, {v[1]};"]
    # silu'(v) = s + v*s*(1-s)
    lines += ["sub.f32 %u, 0f3F800000, %s;", f"mul.f32 %t, {v[0]}, %s;",
              "fma.rn.f32 %u, %t, %u, %s;"]
    if kind == "silu_bwd":
        return lines + [f"mul.f32 {outs[0]}, {v[1]}, %u;"]
    if kind == "swiglu_bwd":  # v = gate, up, g
        return lines + [f"mul.f32 {outs[1]}, {v[2]}, %t;",
                        f"mul.f32 %t, {v[2]}, {v[1]};", f"mul.f32 {outs[0]}, %t, %u;"]
    raise KeyError(kind)


def native_block(kind: str, dtype: str) -> tuple[str, str, int]:
    """(PTX, constraints, n_out) of the SFU comparator for a BF16/B4 kind."""
    n_in, n_out = ARITY[kind]
    lines = [".reg .f32 %s, %t, %u, %i<6>, %o<4>;", ".reg .b16 %hl, %hh;"]
    ins = [f"${n_out + i}" for i in range(n_in)]
    for i, w in enumerate(ins):
        lines += _unpack(w, f"%i{2 * i}", f"%i{2 * i + 1}", dtype)
    for lane in range(2):
        v = [f"%i{2 * i + lane}" for i in range(n_in)]
        lines += _native_lane(kind, v, [f"%o{2 * j + lane}" for j in range(n_out)])
    for j in range(n_out):
        lines.append(_pack(f"${j}", f"%o{2 * j}", f"%o{2 * j + 1}", dtype))
    text = "{\n" + "\n".join(lines) + "\n}"
    return text, ",".join(["=r"] * n_out + ["r"] * n_in), n_out


def block(kind: str, dtype: str, evaluator: str) -> tuple[str, str, int]:
    if evaluator == "poly":
        return poly_block(kind, dtype)[:3]
    if evaluator == "native":
        return native_block(kind, dtype)
    raise ValueError(f"evaluator must be 'poly' or 'native', got {evaluator!r}")
