"""CuTe DSL wrappers that inline the generated PTX blocks (``llvm.inline_asm``).

Only kernels import this module (it imports cutlass at module level).  ``run_block`` takes
CuTe scalars — ``Float32`` for an "f32" input, ``Int32``/``Uint32`` for a packed "b32" input —
and returns a tuple of ``Uint32`` (several outputs come back as one LLVM struct).
``run_program(spec, role, ...)`` inlines block ``role`` of a program (asm/programs.ProgramSpec,
from any table); the named wrappers use the committed coefficient table; pass a ``PtxBlock``
to ``run_block`` to inline any other build (tests use a fixture table).

The asm is marked free of side effects so LLVM may schedule, CSE or drop it like ordinary
arithmetic (it only reads its operands).
"""
from __future__ import annotations

from functools import lru_cache

from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from . import blocks as B


@lru_cache(maxsize=None)
def block(name: str) -> B.PtxBlock:
    """Block ``name`` built from the default table (cached: tracing calls this per use)."""
    return B.get_block(name)


@lru_cache(maxsize=None)
def program_block(spec, role: str) -> B.PtxBlock:
    """Block ``role`` of program ``spec`` (cached: a spec's hash is its content)."""
    return B.block_for(spec, role)


def run_program(spec, role: str, *values) -> tuple:
    """Inline block ``role`` of program ``spec`` on ``values``; one ``Uint32`` per output."""
    return run_block(program_block(spec, role), *values)


def _operand(value, kind: str, loc, ip):
    if kind == "f32":
        return Float32(value).ir_value(loc=loc, ip=ip)
    if isinstance(value, Uint32):
        value = Int32(value)
    return Int32(value).ir_value(loc=loc, ip=ip)


@dsl_user_op
def run_block(blk: B.PtxBlock, *values, loc=None, ip=None) -> tuple:
    """Inline ``blk`` on ``values``; returns one ``Uint32`` per output (packed pairs)."""
    if len(values) != len(blk.in_types):
        raise ValueError(f"{blk.name} takes {len(blk.in_types)} operands, got {len(values)}")
    operands = [_operand(v, t, loc, ip) for v, t in zip(values, blk.in_types)]
    n_out = len(blk.out_types)
    res_type = T.i32() if n_out == 1 else llvm.StructType.get_literal([T.i32()] * n_out)
    res = llvm.inline_asm(res_type, operands, blk.asm_text(), blk.constraints(),
                          has_side_effects=False, is_align_stack=False,
                          asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip)
    if n_out == 1:
        return (Uint32(res),)
    return tuple(Uint32(llvm.extractvalue(T.i32(), res, [k], loc=loc, ip=ip))
                 for k in range(n_out))


# ----------------------------------------------------------------------------- named blocks
def named(name: str, *values) -> Uint32:
    """First output of block ``name`` (asm/blocks.BUILDERS) on ``values``."""
    return run_block(block(name), *values)[0]


def sigmoid_fwd_bwd(s0: Float32, s1: Float32) -> tuple:
    """B3 coupled block: (P, dP surrogate), both bf16x2."""
    return run_block(block("sigmoid_fwd_bwd"), s0, s1)


def softcap_fwd(u0: Float32, u1: Float32) -> Uint32:
    """B2 forward residual rho(u) (bf16x2) of u = logit / c; the kernel forms xc - c*rho."""
    return run_block(block("softcap_fwd"), u0, u1)[0]


def softcap_bwd(u0: Float32, u1: Float32) -> Uint32:
    """B2 backward: the differentiated D3 program at u (bf16x2)."""
    return run_block(block("softcap_bwd"), u0, u1)[0]


def sigmoid_bf16x2(x) -> Uint32:
    return run_block(block("sigmoid_bf16x2"), x)[0]


def silu_fwd_bf16x2(x) -> Uint32:
    return run_block(block("silu_fwd_bf16x2"), x)[0]


def silu_bwd_bf16x2(x) -> Uint32:
    """d silu / dx = p + x p (1 - p) (multiply by the incoming gradient outside)."""
    return run_block(block("silu_bwd_bf16x2"), x)[0]


def swiglu_fwd_bf16x2(gate, up) -> Uint32:
    return run_block(block("swiglu_fwd_bf16x2"), gate, up)[0]


def swiglu_bwd_bf16x2(gate, up, dy) -> tuple:
    """(d_gate, d_up)."""
    return run_block(block("swiglu_bwd_bf16x2"), gate, up, dy)


def f16x2(fn: str, direction: str, x) -> Uint32:
    """FP16 sweep blocks: ``f16x2("gelu", "fwd", x)`` runs ``gelu_fwd_f16x2``."""
    return run_block(block(f"{fn}_{direction}_f16x2"), x)[0]
