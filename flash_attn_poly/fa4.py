"""Our D4 tanh softcap as a flash-attn-4 `score_mod` / `score_mod_bwd` pair.

For users who stay on FA4: one line adopts the polynomial there.

    from flash_attn.cute import flash_attn_func
    from flash_attn_poly.fa4 import softcap_score_mods
    fwd, bwd = softcap_score_mods(50.0)
    out = flash_attn_func(q, k, v, causal=True, score_mod=fwd, score_mod_bwd=bwd)

FA4 hands a score_mod a small vector of already-scaled FP32 scores (2 on its sm80/sm90
forward by default, set by `__vec_size__`); we evaluate them in pairs with the packed
bf16x2 block `softcap_fwd` in residual form, logit = x_c - c * rho(x_c / c) with
x_c = clamp(x, +-c * L_c), exactly as our own kernels do (program `softcap_c50`, see
flash_attn_poly.fit.runtime.softcap_logit). The backward multiplies the incoming gradient
by the differentiated D3 program `softcap_c50_grad` at the same u.
"""
from __future__ import annotations

from functools import lru_cache

PROGRAM = "softcap_c50"


@lru_cache(maxsize=None)
def _clamp_u(program: str = PROGRAM) -> float:
    from flash_attn_poly.asm import programs
    return float(programs.spec(program).clamp)


def softcap_score_mods(softcap: float):
    """(score_mod, score_mod_bwd) for FA4 computing softcap * tanh(score / softcap) on the FMA pipe."""
    if not softcap > 0:
        raise ValueError(f"softcap must be > 0, got {softcap!r}")
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32

    from flash_attn_poly.asm import cute_ops
    from flash_attn_poly.kernels.scores.common import unpack_bf16x2

    c = float(softcap)
    x_max = c * _clamp_u()
    inv_c = 1.0 / c

    def _pairs(vals: cute.Tensor, fn):
        """Apply a pair function over a register vector; an odd last lane runs paired with itself."""
        n = cute.size(vals)
        for i in range(0, n - 1, 2):
            vals[i], vals[i + 1] = fn(vals[i], vals[i + 1])
        if n % 2 == 1:
            vals[n - 1], _ = fn(vals[n - 1], vals[n - 1])

    def _cap_pair(x0: Float32, x1: Float32):
        x0 = cute.arch.fmin(cute.arch.fmax(x0, -x_max), x_max)
        x1 = cute.arch.fmin(cute.arch.fmax(x1, -x_max), x_max)
        r0, r1 = unpack_bf16x2(cute_ops.softcap_fwd(x0 * inv_c, x1 * inv_c))
        return x0 - c * r0, x1 - c * r1

    def _dcap_pair(x0: Float32, x1: Float32):
        u0 = cute.arch.fmin(cute.arch.fmax(x0, -x_max), x_max) * inv_c
        u1 = cute.arch.fmin(cute.arch.fmax(x1, -x_max), x_max) * inv_c
        return unpack_bf16x2(cute_ops.softcap_bwd(u0, u1))

    @cute.jit
    def score_mod(acc_S_SSA, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        vals = cute.make_rmem_tensor(acc_S_SSA.shape, Float32)
        vals.store(acc_S_SSA)
        _pairs(vals, _cap_pair)
        return vals.load()

    @cute.jit
    def score_mod_bwd(grad_out_SSA, score_SSA, batch_idx, head_idx, q_idx, kv_idx, seqlen_info,
                      aux_tensors):
        d = cute.make_rmem_tensor(score_SSA.shape, Float32)
        d.store(score_SSA)
        _pairs(d, _dcap_pair)
        return grad_out_SSA * d.load()

    score_mod.__vec_size__ = 2
    return score_mod, score_mod_bwd
