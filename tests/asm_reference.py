"""What each block must return, built from ``fit.runtime`` (the semantics spec), plus the
standard all-patterns test inputs shared by the CPU emulator test and the GPU self-test
(test support: asm itself never imports fit).

Lane 0 of every input word walks all 65,536 16-bit patterns; lane 1 walks them in a fixed
pseudo-random order, so both lanes see every pattern and lane mixing bugs show up.
"""
from __future__ import annotations

import numpy as np

from flash_attn_poly.asm import blocks as B
from flash_attn_poly.asm import fpbits as fb
from flash_attn_poly.asm import programs as PG
from flash_attn_poly.fit import runtime as rt

N = 1 << 16


def patterns(seed: int) -> np.ndarray:
    """A permutation of all 16-bit patterns (seed 0: identity)."""
    pats = np.arange(N, dtype=np.uint32)
    return pats if seed == 0 else np.random.default_rng(seed).permutation(pats)


def lane_inputs(n_inputs: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per input: (lane0 patterns, lane1 patterns); input i uses seeds 2i and 2i+1."""
    return [(patterns(2 * i), patterns(2 * i + 1)) for i in range(n_inputs)]


def is_scalar_f32(block: B.PtxBlock) -> bool:
    """One FP32 operand in, one FP32 result's bits out (exp2_f32): no 16-bit lanes."""
    return block.in_types == ("f32",)


def scalar_f32_inputs() -> np.ndarray:
    """N FP32 arguments of a scalar block: every half-integer in [-125, 127) (the rounding
    ties of exp2_f32's j), a uniform grid of the rest of its valid range [-125, 127], and one
    NaN last (a NaN score reaches the exp2 offload: the GPU-vs-emulator test pins its bits)."""
    halves = np.arange(-125, 127) + 0.5
    grid = np.linspace(-125.0, 127.0, N - halves.size - 1)
    return np.concatenate([halves, grid, [np.nan]]).astype(np.float32)


def block_inputs(block: B.PtxBlock, dtype: str) -> list[np.ndarray]:
    """Emulator/kernel operands: packed uint32 words, or float32 arrays for f32 inputs.

    An f32 input is the exact value of the 16-bit pattern (cvt.rn is then the identity), so
    lane k of input i carries pattern lane_inputs(...)[i][k].  A scalar FP32 block takes
    scalar_f32_inputs()."""
    if is_scalar_f32(block):
        return [scalar_f32_inputs()]
    ins = lane_inputs(len(block.in_types) if block.in_types[0] == "b32" else 1)
    if block.in_types[0] == "f32":
        lo, hi = ins[0]
        return [rt.from_bits(lo, dtype).astype(np.float32),
                rt.from_bits(hi, dtype).astype(np.float32)]
    return [fb.pack(lo, hi) for lo, hi in ins]


def _sigmoid_chain(table, x):
    """p, s = x*p as the bf16x2 SiLU blocks compute them: the program inside its clamp,
    exactly 0 / 1 beyond it (|x| > L_c; NaN keeps the program's NaN)."""
    prog = PG.entry(B.SIGMOID_D3, table)
    x = np.asarray(x, np.float64)
    p = rt.replay(prog, x, "fused")
    p = np.where(np.abs(x) > prog["L_c"], (x > 0).astype(np.float64), p)
    return p, rt.mul(x, p, "bf16")


def _silu_grad(p, s):
    return rt.fma(s, rt.add(1.0, -p, "bf16"), p, "bf16")


def expected_values(block, table: dict, xs: list[np.ndarray]) -> list[np.ndarray]:
    """float64 lane values ``block`` (a PtxBlock or a named block's name) must produce for lane
    values xs (one per input): the composite named blocks by their rule, every other block one
    program replay per output (a value block, or the coupled block's value and surrogate)."""
    if isinstance(block, str):
        block = B.get_block(block, table)
    name = block.name
    progs = [PG.entry(p, table) for p in block.programs]
    if name == "silu_fwd_bf16x2":
        return [_sigmoid_chain(table, xs[0])[1]]
    if name == "silu_bwd_bf16x2":
        return [_silu_grad(*_sigmoid_chain(table, xs[0]))]
    if name == "swiglu_fwd_bf16x2":
        return [rt.mul(_sigmoid_chain(table, xs[0])[1], xs[1], "bf16")]
    if name == "swiglu_bwd_bf16x2":
        gate, up, dy = xs
        p, s = _sigmoid_chain(table, gate)
        d_gate = rt.mul(rt.mul(dy, up, "bf16"), _silu_grad(p, s), "bf16")
        return [d_gate, rt.mul(dy, s, "bf16")]
    if name == "geglu_fwd_bf16x2":
        return [rt.mul(rt.replay(PG.entry(B.GELU_D4, table), xs[0], "fused"), xs[1], "bf16")]
    if name == "geglu_bwd_bf16x2":
        gate, up, dy = xs
        val = rt.replay(PG.entry(B.GELU_D4, table), gate, "fused")
        der = rt.replay(PG.entry(B.GELU_D4_GRAD, table), gate, "fused")
        return [rt.mul(rt.mul(dy, up, "bf16"), der, "bf16"), rt.mul(dy, val, "bf16")]
    assert len(progs) == len(block.out_types), name
    return [rt.replay(p, xs[0], "fused") for p in progs]


def block_dtype(block: B.PtxBlock, table: dict) -> str:
    """The 16-bit type of the block's lanes: its (first) program's dtype."""
    return PG.entry(block.programs[0], table)["dtype"]


def expected_words(block: B.PtxBlock, table: dict) -> tuple[list[np.ndarray], np.ndarray]:
    """(expected packed output words, per-element mask of lanes the spec covers).

    f32-input blocks: lanes whose input is NaN are excluded, because cvt.rn makes every NaN
    the canonical positive 0x7fff while runtime.replay keeps the NaN's sign bit (kernels
    never pass NaN scores to them but from NaN inputs).  A scalar FP32 block's word is its FP32
    result (fit/exp2.replay for exp2_f32), its NaN argument excluded (the emulator's bits for it,
    FLT_MAX, are what tests/test_asm_gpu.py holds the GPU to)."""
    if is_scalar_f32(block):
        from flash_attn_poly.fit import exp2
        (prog,) = [PG.entry(p, table) for p in block.programs]
        a = scalar_f32_inputs().astype(np.float64)
        val = exp2.replay(prog, a)
        return [val.astype(np.float32).view(np.uint32)], ~np.isnan(a)   # NaN: the emulator's bits
    dtype = block_dtype(block, table)
    ins = lane_inputs(len(block.in_types) if block.in_types[0] == "b32" else 1)
    lanes_out = []
    for k in (0, 1):
        xs = [rt.from_bits(pair[k], dtype) for pair in ins]
        lanes_out.append([rt.to_bits(v, dtype) for v in expected_values(block, table, xs)])
    words = [fb.pack(lanes_out[0][j], lanes_out[1][j]) for j in range(len(block.out_types))]
    valid = np.ones(N, bool)
    if block.in_types[0] == "f32":
        for k in (0, 1):
            valid &= ~np.isnan(rt.from_bits(ins[0][k], dtype))
    return words, valid
