"""Score functions that replay the deployed polynomial programs, for the torch references.

`attention_ref(..., score_fn=...)` with these computes the math a "poly" kernel runs (the
program in its fused BF16 order, from fit.runtime, with the kernel's FP32 data flow around
it), so a kernel can be checked tightly against that and loosely against the exact
function. The replay is numpy on the CPU: meant for test-sized problems.  A test oracle (it
replays with flash_attn_poly.fit.runtime, which the product never imports).  Programs are
names of the committed table or ProgramSpecs of any table (asm.programs.spec).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch

from flash_attn_poly.asm import programs
from flash_attn_poly.fit import runtime

SIGMOID_PROGRAM_N = 4096          # the sigmoid-attention program the kernels inline
SOFTCAP_PROGRAM = "softcap_c50"
SIGMOID_GRAD_RULE = "product"     # = the sigmoid grad row of flash_attn_poly.plan (GRAD_ROWS)
# softcap d logit/dx rule by default: "value" for FP16 programs, "block" for BF16 ones
# (= the softcap grad rows of flash_attn_poly.plan, by the program's dtype)


def _spec(program) -> "programs.ProgramSpec":
    return program if isinstance(program, programs.ProgramSpec) else programs.spec(program)


def _apply(fn: Callable[[np.ndarray], np.ndarray], x: torch.Tensor) -> torch.Tensor:
    # scores arrive as float64 in the reference; the kernels hold them in FP32
    x32 = x.detach().to(torch.float32).cpu().numpy().astype(np.float64)
    return torch.from_numpy(fn(x32)).to(device=x.device, dtype=torch.float64)


def sigmoid_fns(bias: float, n: int = SIGMOID_PROGRAM_N, grad_rule: str = None, program: str = None,
                io_dtype: str = "bf16", forward: bool = True, mufu_above: float = None):
    """(score_fn, score_grad_fn): the program's forward block on x' = x + bias + ln n, and the
    backward's sigma': p (1 - p) of that block's BF16 p ("product", the plan's default,
    ScoreSpec.grad_rule; kernels/scores/sigmoid.py) or the coupled block's derivative
    surrogate ("surrogate", seed B3, from the program's _grad entry).  program: a table entry
    (name or ProgramSpec) other than sigmoid_attn_n{n}, whose own n then applies; an FP16
    program's P is rounded to the PV operand's type (io_dtype: "bf16" for BF16 inputs, "f16"
    keeps the block's f16 P, as the kernels do for FP16 inputs), and its sigma' is p (1 - p)
    of the FP16 p (product rule only).
    forward: the forward kernel's P around the program's clamp [params.lo, params.hi]
    (kernels/scores/sigmoid.py): the exact sigmoid where the block input passes hi, or
    mufu_above where that is lower (ScoreSpec.mufu_above, the plan's threshold) (the kernel's
    MUFU fix-up, there for every block pair of a thread row's key block once one passes; those
    pairs' inputs below hi differ from this model by the program's error), +0 at or below lo;
    False: the block's P, capped at P(hi) and floored at P(lo), which the surrogate backward's
    coupled block keeps."""
    grad_rule = grad_rule or SIGMOID_GRAD_RULE
    spec = _spec(program or f"sigmoid_attn_n{n}")
    p_fwd = spec.entry()
    f16 = spec.f16
    if f16 and grad_rule != "product":
        raise ValueError("an FP16 sigmoid program has only the product rule")
    if grad_rule == "surrogate" and spec.grad is None:
        raise ValueError(f"sigmoid program {spec.name!r} has no _grad entry: only the product rule")
    p_grad = spec.grad.entry() if grad_rule == "surrogate" else None
    shift = bias + math.log(spec.n)

    def shifted(x):
        return runtime.round_to(x + shift, "f32")  # the kernel's FP32 fma(s, scale, shift)

    def product(a):
        p = runtime.replay(p_fwd, shifted(a), "fused")
        return p - p * p

    lo, hi = float(spec.param("lo")), float(spec.param("hi"))
    if mufu_above is not None:
        hi = min(hi, float(mufu_above))

    def value(a):
        xs = shifted(a)
        p = runtime.replay(p_fwd, xs, "fused")
        if forward:
            with np.errstate(over="ignore"):
                p = np.where(xs > hi, 1.0 / (1.0 + np.exp(-(a + bias))), np.where(xs > lo, p, 0.0))
        return runtime.round_to(p, "bf16") if f16 and io_dtype == "bf16" else p

    grad = product if grad_rule == "product" else (lambda a: runtime.replay(p_grad, shifted(a), "fused"))
    return (lambda x: _apply(value, x), lambda x: _apply(grad, x))


def softcap_fns(softcap: float, program: str = SOFTCAP_PROGRAM, grad_rule: str = None):
    """(score_fn, score_grad_fn): logit = x_c - c*rho(x_c/c) and d logit/dx, by grad_rule
    (ScoreSpec.grad_rule; kernels/scores/softcap.py): "block" replays the _grad program,
    "value" is 1 - t^2 of t = logit * fp32(1/c) in FP32."""
    spec = _spec(program)
    prog = spec.entry()
    grad_rule = grad_rule or ("value" if spec.f16 else "block")
    if grad_rule not in ("block", "value"):
        raise ValueError(f"softcap grad_rule must be 'block' or 'value', got {grad_rule!r}")
    grad = spec.grad.entry() if grad_rule == "block" else None   # odd_u2 programs have none
    prog = {**prog, "params": {**prog["params"], "c": softcap}}
    lim = softcap * prog["L_c"]
    inv_c = runtime.round_to(1.0 / softcap, "f32")

    def dlogit(a):
        if grad_rule == "value":
            t = runtime.mul(runtime.softcap_logit(prog, a, "fused"), inv_c, "f32")
            return runtime.round_to(1.0 - runtime.mul(t, t, "f32"), "f32")
        u = runtime.mul(np.clip(a, -lim, lim), inv_c, "f32")
        return runtime.replay(grad, u, "fused")

    return (lambda x: _apply(lambda a: runtime.softcap_logit(prog, a, "fused"), x),
            lambda x: _apply(dlogit, x))


def split_fns(mode: str, score, s_k: int, softcap: float = 50.0, sigmoid_bias=None, sigmoid_grad=None,
              io_dtype: str = "bf16", softcap_grad=None, side: str = "fwd"):
    """(score_fn, score_grad_fn) of a poly score per key column: `score` is the plan's
    kernels.scores.ScoreSpec (plan.score; plan.score_bwd is the same spec for a poly score);
    column n uses the program replay when the spec's poly_split sends key column group n // 8
    through the block (kernels.scores.poly_pair, the kernels' rule) and the exact function
    otherwise (the MUFU columns' target).  Scores x (..., S_k) are scaled scores, key index
    last; the same rule serves the forward and the backward reference.  The grad rule is the
    spec's unless sigmoid_grad / softcap_grad name another.  io_dtype: the attention inputs'
    type, "bf16" or "f16" (sigmoid: the PV operand P).  side: "fwd" or "bwd" (sigmoid: the
    forward's P is exact above the program's clamp and 0 below it, the surrogate backward's
    block P is capped and floored: sigmoid_fns forward)."""
    from flash_attn_poly.kernels.scores import poly_pair
    if score.evaluator != "poly" or score.program is None:
        raise ValueError(f"split_fns replays a poly score's program; got evaluator {score.evaluator!r}, "
                         f"program {score.program!r}")
    if mode == "softcap":
        poly, poly_grad = softcap_fns(softcap, score.program, softcap_grad or score.grad_rule)
        exact = lambda x: softcap * torch.tanh(x / softcap)
        exact_grad = lambda x: 1 - torch.tanh(x / softcap) ** 2
    else:
        b = -math.log(s_k) if sigmoid_bias is None else float(sigmoid_bias)
        poly, poly_grad = sigmoid_fns(b, score.program.n, sigmoid_grad or score.grad_rule, score.program, io_dtype,
                                      forward=side == "fwd",
                                      mufu_above=score.mufu_above if side == "fwd" else None)
        exact = lambda x: torch.sigmoid(x + b)
        exact_grad = lambda x: torch.sigmoid(x + b) * (1 - torch.sigmoid(x + b))
    cols = torch.tensor([bool(poly_pair(score.poly_split, n // 8)) for n in range(s_k)])

    def per_column(fn_poly, fn_exact):
        return lambda x: torch.where(cols.to(x.device), fn_poly(x).to(x.dtype), fn_exact(x))
    return per_column(poly, exact), per_column(poly_grad, exact_grad)
