"""flash-attn-4's kernels with our score functions: `attention(..., backend="fa4")`.

flash-attn-4 (`pip install flash-attn-poly[fa4]`, the `flash_attn.cute` package) runs on Hopper
and Blackwell; our own kernels are sm_90 only.  This module hands FA4 our score functions as
its `score_mod` / `score_mod_bwd` through its public `flash_attn_func`, and FA4's autograd does
the rest.  What runs is the plan's (`flash_attn_poly.plan.resolve_fa4`):

  softmax            FA4 as is (or a user ScoreMod, passed through with its aux tensors);
  softcap, native    FA4's own softcap (tanh on MUFU);
  softcap, poly      the plan's softcap program on every score pair: logit = c u - c rho(u) of
                     u = clamp(x / c, +-L) (odd_u2 programs: kernels.scores.softcap.
                     softcap_u2_pair) or logit = x_c - c rho(x_c / c) (residual programs:
                     softcap_combine), the tanh off the MUFU pipe; the backward by the plan's
                     grad rule ("value": 1 - (logit/c)^2; "block": the program's derivative);
  sigmoid            FA4 computes softmax, so sigmoid attention goes through the identity
                     sum_j sigma_j v_j = softmax(ln sigma)_j v_j * sum_j sigma_j = O * exp(LSE):
                     score_mod f(x) = ln sigma(x + b), and attention() returns O * exp(LSE)
                     (autograd reaches LSE through FA4's dLSE).  native: sigma = 0.5 tanh(0.5 z)
                     + 0.5 (MUFU.TANH) then ln (MUFU.LG2); poly: the program's packed P (fed
                     x + b + ln n, as our kernels do) then ln.  d f / dx = 1 - sigma.

FA4 hands a score_mod a small vector of already-scaled FP32 scores (`__vec_size__`, 2 here);
the programs run on pairs (an odd last lane paired with itself).  Each function carries a
`__cute_hash__` naming what it computes (FA4's compile cache key), so equal score functions
share FA4's compiled kernels; the factories are cached, so a call signature builds once.
"""
from __future__ import annotations

import math
from functools import lru_cache

PROGRAM = "softcap_c50"   # the seed's B2 program: softcap_score_mods' default (the one-line FA4 use)
EXTRA = "flash-attn-poly[fa4]"


_IMPORTED: list = []   # [module] or [ImportError]: one import attempt per process


def require():
    """The `flash_attn.cute` module, or an ImportError naming the extra that installs it."""
    if not _IMPORTED:
        try:
            import flash_attn.cute as fa4
            _IMPORTED.append(fa4)
        except ImportError as e:
            _IMPORTED.append(ImportError(f"backend='fa4' needs flash-attn-4 (the flash_attn.cute package): "
                                         f"pip install '{EXTRA}' (flash-attn-4==4.0.0b36); import failed: {e}"))
    if isinstance(_IMPORTED[0], ImportError):
        raise _IMPORTED[0]
    return _IMPORTED[0]


def _spec(program):
    from flash_attn_poly.asm import programs
    return program if isinstance(program, programs.ProgramSpec) else programs.spec(program)


def _pairs(vals, fn):
    """Apply a pair function over a register vector; an odd last lane runs paired with itself."""
    import cutlass.cute as cute
    n = cute.size(vals)
    for i in range(0, n - 1, 2):
        vals[i], vals[i + 1] = fn(vals[i], vals[i + 1])
    if n % 2 == 1:
        vals[n - 1], _ = fn(vals[n - 1], vals[n - 1])


def _wrap(fwd_pair, bwd_pair, tag: str):
    """(score_mod, score_mod_bwd) of FA4's signature from pair functions: fwd_pair(x0, x1) ->
    (y0, y1) on scaled scores, bwd_pair(x0, x1) -> (dy0/dx0, dy1/dx1)."""
    import cutlass.cute as cute
    from cutlass import Float32

    @cute.jit
    def score_mod(acc_S_SSA, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        vals = cute.make_rmem_tensor(acc_S_SSA.shape, Float32)
        vals.store(acc_S_SSA)
        _pairs(vals, fwd_pair)
        return vals.load()

    @cute.jit
    def score_mod_bwd(grad_out_SSA, score_SSA, batch_idx, head_idx, q_idx, kv_idx, seqlen_info,
                      aux_tensors):
        d = cute.make_rmem_tensor(score_SSA.shape, Float32)
        d.store(score_SSA)
        _pairs(d, bwd_pair)
        return grad_out_SSA * d.load()

    score_mod.__vec_size__ = 2
    score_mod.__cute_hash__ = f"flash_attn_poly.fa4:{tag}:fwd"
    score_mod_bwd.__cute_hash__ = f"flash_attn_poly.fa4:{tag}:bwd"
    return score_mod, score_mod_bwd


def _program_tag(spec) -> str:
    import hashlib
    return f"{spec.name}@{hashlib.sha256(spec.json_text.encode()).hexdigest()[:16]}"


@lru_cache(maxsize=64)
def softcap_score_mods(softcap: float, program=PROGRAM, grad_rule: str | None = None):
    """(score_mod, score_mod_bwd) for FA4 computing softcap * tanh(score / softcap) with a softcap
    program of the table (default the seed's BF16 "softcap_c50") on the FMA pipe.  grad_rule:
    "value" (1 - (logit/c)^2) or "block" (the program's derivative block); None: "block" where
    the program has one.

        from flash_attn.cute import flash_attn_func
        fwd, bwd = softcap_score_mods(50.0)
        out = flash_attn_func(q, k, v, causal=True, score_mod=fwd, score_mod_bwd=bwd)
    """
    if not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap > 0):
        raise ValueError(f"softcap must be a finite number > 0, got {softcap!r}")
    spec = _spec(program)
    if spec.mode != "softcap" or "fwd" not in spec.roles or spec.is_exp2:
        raise ValueError(f"program {spec.name!r} (target {spec.target!r}, form {spec.form!r}) is not a softcap "
                         f"program with a forward block; FA4 takes the tanh programs of the table, not the "
                         f"exp2 offload (FA4 runs its own exp2)")
    rule = grad_rule or ("block" if "bwd" in spec.roles else "value")
    if rule not in ("value", "block") or (rule == "block" and "bwd" not in spec.roles):
        raise ValueError(f"grad_rule={grad_rule!r}: softcap program {spec.name!r} takes 'value'"
                         + (" or 'block'" if "bwd" in spec.roles else " (no derivative block)"))
    import cutlass.cute as cute
    from cutlass import Float32, Int32

    from flash_attn_poly.kernels.scores.common import run_program, unpack_bf16x2, unpack_f16x2
    from flash_attn_poly.kernels.scores.softcap import softcap_combine, softcap_u2_pair

    c, L = float(softcap), float(spec.clamp)
    inv_c, x_max, tail_u = 1.0 / c, c * L, spec.region_threshold_f32
    unpack = unpack_f16x2 if spec.f16 else unpack_bf16x2

    if spec.clamp_on_fma:   # odd_u2: u = clamp(x / c, +-L) by fma.rn.sat, logit = c u - c rho
        alpha = inv_c * (1.0 / (2.0 * L))   # softcap_u2_alpha of u_scale = 1/c, on the host

        def logit_pair(x0, x1):   # (logits, tanh(u) = u - rho(u)): the kernels' u2 forms
            u0, u1, r0, r1 = softcap_u2_pair(x0, x1, Float32(alpha), L, spec)
            return Float32(c) * u0 - Float32(c) * r0, Float32(c) * u1 - Float32(c) * r1, u0 - r0, u1 - r1
    else:                   # residual: logit = x_c - c rho(x_c / c), x_c = clamp(x, +-c L)
        def logit_pair(x0, x1):   # (logits, logit / c)
            x0 = cute.arch.fmin(cute.arch.fmax(x0, -x_max), x_max)
            x1 = cute.arch.fmin(cute.arch.fmax(x1, -x_max), x_max)
            u0, u1 = x0 * inv_c, x1 * inv_c
            r0, r1 = unpack(Int32(run_program(spec, "fwd", u0, u1)[0]))
            l0 = softcap_combine(x0, r0, u0, Float32(c), tail_u)
            l1 = softcap_combine(x1, r1, u1, Float32(c), tail_u)
            return l0, l1, l0 * inv_c, l1 * inv_c

    def fwd_pair(x0, x1):
        l0, l1, _, _ = logit_pair(x0, x1)
        return l0, l1

    if rule == "value":
        def bwd_pair(x0, x1):
            _, _, t0, t1 = logit_pair(x0, x1)
            return 1.0 - t0 * t0, 1.0 - t1 * t1
    else:
        def bwd_pair(x0, x1):
            u0 = cute.arch.fmin(cute.arch.fmax(x0, -x_max), x_max) * inv_c
            u1 = cute.arch.fmin(cute.arch.fmax(x1, -x_max), x_max) * inv_c
            return unpack(Int32(run_program(spec, "bwd", u0, u1)[0]))

    return _wrap(fwd_pair, bwd_pair, f"softcap:c={c!r}:{_program_tag(spec)}:{rule}")


@lru_cache(maxsize=64)
def sigmoid_score_mods(bias: float, program=None):
    """(score_mod, score_mod_bwd) for FA4 computing f(x) = ln sigma(x + bias) (see the module
    docstring: FA4's softmax of f times exp(LSE) is sigmoid attention).  program=None: sigma on
    MUFU (0.5 tanh(0.5 z) + 0.5); else a sigmoid-attention program of the table."""
    if not (isinstance(bias, (int, float)) and math.isfinite(bias)):
        raise ValueError(f"sigmoid_bias must be a finite number, got {bias!r}")
    import cutlass.cute as cute
    from cutlass import Float32, Int32

    from flash_attn_poly.kernels.scores.common import run_program, tanh_approx, unpack_bf16x2, unpack_f16x2

    b = float(bias)
    if program is None:
        tag = "native"

        def sig_pair(x0, x1):
            s0 = tanh_approx((x0 + b) * 0.5) * 0.5 + 0.5
            s1 = tanh_approx((x1 + b) * 0.5) * 0.5 + 0.5
            return s0, s1
    else:
        spec = _spec(program)
        if spec.mode != "sigmoid" or "fwd" not in spec.roles:
            raise ValueError(f"program {spec.name!r} (target {spec.target!r}) is not a sigmoid-attention program "
                             f"with a forward block")
        shift = b + math.log(spec.n)   # the program computes sigma(x' - ln n): fed x' = x + b + ln n
        unpack = unpack_f16x2 if spec.f16 else unpack_bf16x2
        tag = _program_tag(spec)

        def sig_pair(x0, x1):
            return unpack(Int32(run_program(spec, "fwd", x0 + shift, x1 + shift)[0]))

    def fwd_pair(x0, x1):
        s0, s1 = sig_pair(x0, x1)
        return cute.math.log(s0, fastmath=True), cute.math.log(s1, fastmath=True)

    def bwd_pair(x0, x1):
        s0, s1 = sig_pair(x0, x1)
        return Float32(1.0) - s0, Float32(1.0) - s1

    return _wrap(fwd_pair, bwd_pair, f"sigmoid:b={b!r}:{tag}")


def score_mods(plan):
    """(score_mod, score_mod_bwd, softcap) flash_attn_func takes for a plan.resolve_fa4 plan."""
    if plan.score == "user":
        return plan.call.score_mod.fwd, plan.call.score_mod.bwd, 0.0
    if plan.score == "softmax":
        return None, None, 0.0
    if plan.score == "softcap":
        if plan.program is None:
            return None, None, plan.softcap   # FA4's native softcap
        return (*softcap_score_mods(plan.softcap, plan.program, plan.grad_rule), 0.0)
    return (*sigmoid_score_mods(plan.sigmoid_bias, plan.program), 0.0)


def attention(q, k, v, plan, aux_tensors=(), return_lse=False):
    """attention() on FA4 for a plan.resolve_fa4 plan: (out, lse) if return_lse else out."""
    fa4 = require()
    import torch
    fwd, bwd, cap = score_mods(plan)
    call = plan.call
    wl, wr = call.window
    window = (None if wl < 0 else wl, None if wr < 0 else wr)
    need_lse = return_lse or plan.score == "sigmoid"
    res = fa4.flash_attn_func(q, k, v, softmax_scale=plan.softmax_scale, causal=call.causal,
                              window_size=window, softcap=cap, deterministic=call.deterministic,
                              score_mod=fwd, score_mod_bwd=bwd, aux_tensors=list(aux_tensors) or None,
                              return_lse=need_lse)
    out, lse = res if isinstance(res, tuple) else (res, None)
    if plan.score == "sigmoid":   # O * sum_j sigma_j = O * exp(LSE): FP32, one rounding to q's dtype
        out = (out.float() * torch.exp(lse).transpose(1, 2).unsqueeze(-1)).to(q.dtype)
    return (out, lse) if return_lse else out
