"""The torch reference of what a resolved plan's kernels compute (flash_attn_poly.plan.AttnPlan).

`score_fns(plan)` gives the (score_fn, score_grad_fn) pair for reference.attention_ref /
attention_ref_backward: for a poly score, poly_reference.split_fns with the plan's own program,
poly split and grad rule (block columns replay the program, MUFU columns the exact function);
for a native score (None, None), the exact function.  The exp2 offload is native here: its
logits come from MUFU tanh and its P = 2^a is within 7.5e-5 relative of MUFU's, below BF16 P's
rounding.  The GPU tests judge a kernel against this, so a test follows whatever the plan
resolves (tests/test_plan_cpu.py pins what it resolves).
"""
from __future__ import annotations

import poly_reference as PR


def score_fns(plan, io_dtype: str = None, side: str = "fwd"):
    """(score_fn, score_grad_fn) of plan's forward score (side "bwd": of its backward score,
    native where the backward recomputes P on MUFU: sigmoid's product rule, the exp2 offload);
    io_dtype ("bf16" | "f16", default the call's dtype): the attention inputs' type (a sigmoid
    FP16 program's P is rounded to it)."""
    spec = plan.score if side == "fwd" else plan.score_bwd
    if spec.evaluator != "poly":
        return None, None
    from flash_attn_poly.kernels import scores
    call = plan.call
    io = io_dtype or ("f16" if call.dtype == "fp16" else "bf16")
    rule = spec.grad_rule
    return PR.split_fns(call.mode, scores.device(spec), call.seqlen_k,
                        plan.softcap if plan.softcap is not None else 50.0,
                        sigmoid_bias=plan.sigmoid_bias,
                        sigmoid_grad=rule if call.mode == "sigmoid" else None, io_dtype=io,
                        softcap_grad=rule if call.mode == "softcap" else None, side=side)
