"""Eager torch references for every attention mode (upcast; slow, exact enough to judge kernels).

Layouts follow flash_attn_func: q (B, S_q, H_q, D), k and v (B, S_k, H_kv, D) with
H_q a multiple of H_kv (grouped-query attention). Causal masking is aligned to the
bottom-right corner, as in flash-attn 2.1+: query i may see key j when
j <= i + (S_k - S_q). A query row that sees no key produces a zero output row and
LSE = -inf; a NaN or Inf in the inputs propagates as in torch's own math (IEEE), so a
row that sees a NaN is NaN, never zero (see softmax_rows).

`score_fn` replaces the transcendental part of a mode, so tests can build a
reference that runs the very polynomial program a kernel runs (see
`flash_attn_poly.fit.runtime`) as well as one with the exact function.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from einops import rearrange, repeat

MODES = ("softmax", "softcap", "sigmoid")


def causal_mask(s_q: int, s_k: int, device=None) -> torch.Tensor:
    """Boolean (S_q, S_k) mask, True where query i may attend to key j (bottom-right aligned)."""
    i = torch.arange(s_q, device=device)[:, None]
    j = torch.arange(s_k, device=device)[None, :]
    return j <= i + (s_k - s_q)


def window_mask(s_q: int, s_k: int, left: int, right: int, device=None) -> torch.Tensor:
    """flash-attn's window_size=(left, right) around the bottom-right-aligned diagonal; -1 = unbounded."""
    i = torch.arange(s_q, device=device)[:, None] + (s_k - s_q)
    j = torch.arange(s_k, device=device)[None, :]
    ok = torch.ones(s_q, s_k, dtype=torch.bool, device=device)
    if left >= 0:
        ok &= j >= i - left
    if right >= 0:
        ok &= j <= i + right
    return ok


def default_sigmoid_bias(s_k: int) -> float:
    """b = -ln n with n the number of keys: keeps sum_j sigmoid(x_ij + b) near 1 for small scores."""
    return -math.log(s_k)


def softmax_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p, lse): softmax and logsumexp over the last dim, with a row whose logits are all -inf
    (a query that sees no key) zero instead of exp(-inf - -inf) = NaN.  Only such rows: a NaN
    or +inf logit leaves its row NaN as in torch.softmax (lse NaN or +inf), so a NaN input is
    not mistaken for an empty row."""
    lse = torch.logsumexp(x, dim=-1)
    p = torch.exp(x - lse[..., None]).masked_fill((lse == -math.inf)[..., None], 0.0)
    return p, lse


def scores(q: torch.Tensor, k: torch.Tensor, softmax_scale: float, dtype=torch.float64) -> torch.Tensor:
    """Scaled scores x = scale * q k^T as (B, H_q, S_q, S_k) in `dtype`, GQA heads expanded."""
    h_q, h_kv = q.shape[2], k.shape[2]
    k = repeat(k, "b s h d -> b s (h g) d", g=h_q // h_kv)
    return torch.einsum("bqhd,bkhd->bhqk", q.to(dtype), k.to(dtype)) * softmax_scale


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mode: str = "softmax",
    *,
    causal: bool = True,
    softcap: Optional[float] = None,
    sigmoid_bias: Optional[float] = None,
    softmax_scale: Optional[float] = None,
    window_size: tuple[int, int] = (-1, -1),
    score_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Return (out in q.dtype-free `dtype`, lse (B, H_q, S_q) or None for sigmoid).

    score_fn, if given, maps scaled scores to: capped logits (softcap), probabilities
    (sigmoid, bias included), or the logits the softmax normalises (softmax: a user score_mod).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    s_q, s_k = q.shape[1], k.shape[1]
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    x = scores(q, k, scale, dtype)
    allowed = window_mask(s_q, s_k, *window_size, device=q.device)
    if causal:
        allowed &= causal_mask(s_q, s_k, device=q.device)
    h_q, h_kv = q.shape[2], v.shape[2]
    v_up = repeat(v, "b s h d -> b s (h g) d", g=h_q // h_kv).to(dtype)

    if mode == "sigmoid":
        bias = sigmoid_bias if sigmoid_bias is not None else default_sigmoid_bias(s_k)
        p = score_fn(x) if score_fn is not None else torch.sigmoid(x + bias)
        p = p.to(dtype).masked_fill(~allowed, 0.0)
        return torch.einsum("bhqk,bkhd->bqhd", p, v_up), None

    if mode == "softcap":
        if softcap is None or softcap <= 0:
            raise ValueError("softcap mode needs softcap > 0")
        x = score_fn(x).to(dtype) if score_fn is not None else softcap * torch.tanh(x / softcap)
    elif score_fn is not None:   # softmax over a user score function's output (score_mod)
        x = score_fn(x).to(dtype)
    p, lse = softmax_rows(x.masked_fill(~allowed, float("-inf")))
    out = torch.einsum("bhqk,bkhd->bqhd", p, v_up)
    return out, lse


def attention_ref_lowprec(q, k, v, mode="softmax", *, causal=True, softcap=None, sigmoid_bias=None,
                          softmax_scale=None, window_size=(-1, -1), score_fn=None, fixed_max=None):
    """The same computation in the inputs' own precision pipeline: scores and the score
    function in FP32, probabilities rounded to q.dtype before the PV product, output in
    q.dtype. Its error against `attention_ref` sets the scale of what a kernel may be off
    by (see flash_attn_poly.testing).  fixed_max (softmax modes): the constant row max m0 of
    a kernel built with FwdConfig.fixed_max: p = exp(logit - m0) is rounded to q.dtype for
    the PV product and the row sum adds the same rounded p, so O = sum(p v) / sum(p) of the
    rounded weights (a row whose mass sits on one key returns that key's v exactly, as the
    row's own max, p = 1, does)."""
    s_q, s_k = q.shape[1], k.shape[1]
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    x = scores(q, k, scale, torch.float32)
    allowed = window_mask(s_q, s_k, *window_size, device=q.device)
    if causal:
        allowed &= causal_mask(s_q, s_k, device=q.device)
    h_q, h_kv = q.shape[2], v.shape[2]
    v_up = repeat(v, "b s h d -> b s (h g) d", g=h_q // h_kv)
    lse, rsum = None, None
    if mode == "sigmoid":
        bias = sigmoid_bias if sigmoid_bias is not None else default_sigmoid_bias(s_k)
        p = score_fn(x).float() if score_fn is not None else torch.sigmoid(x + bias)
        p = p.masked_fill(~allowed, 0.0)
    else:
        if mode == "softcap":
            x = score_fn(x).float() if score_fn is not None else softcap * torch.tanh(x / softcap)
        x = x.masked_fill(~allowed, float("-inf"))
        p, lse = softmax_rows(x)
        if fixed_max is not None:   # unnormalised p against m0; O divided by their rounded sum
            p = torch.exp(x - fixed_max)
    p = p.to(q.dtype).float()
    if fixed_max is not None:
        rsum = p.sum(-1)
    if rsum is not None:
        p = p / torch.where(rsum > 0, rsum, 1.0)[..., None]
    out = torch.einsum("bhqk,bkhd->bqhd", p, v_up.float()).to(q.dtype)
    return out, lse


def to_bhsd(t: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) -> (B, H, S, D) view, for callers that think in the transformers layout."""
    return rearrange(t, "b s h d -> b h s d")


def attention_ref_backward(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mode: str = "softmax", *,
    causal: bool = True, softcap: Optional[float] = None, sigmoid_bias: Optional[float] = None,
    softmax_scale: Optional[float] = None, window_size: tuple[int, int] = (-1, -1),
    score_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    score_grad_fn: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    dtype: torch.dtype = torch.float64, out: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) in `dtype` by the explicit backward formulas (no autograd needed).
    out (softmax modes): a forward output to take D = rowsum(dO o out) from, as a backward
    kernel does with the O it is given (None: D of the exact P).

    score_grad_fn(x) is the derivative the kernel uses for the score function: the
    capped-logit derivative d(softcap)/dx for softcap, the probability derivative for
    sigmoid (bias included). Defaults are the exact derivatives. With the polynomial
    programs plugged in, this is the math a poly backward kernel implements.
    """
    s_q, s_k = q.shape[1], k.shape[1]
    h_q, h_kv = q.shape[2], k.shape[2]
    grp = h_q // h_kv
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    x = scores(q, k, scale, dtype)
    allowed = window_mask(s_q, s_k, *window_size, device=q.device)
    if causal:
        allowed &= causal_mask(s_q, s_k, device=q.device)
    k_up = repeat(k, "b s h d -> b s (h g) d", g=grp).to(dtype)
    v_up = repeat(v, "b s h d -> b s (h g) d", g=grp).to(dtype)
    do = dout.to(dtype)
    dp = torch.einsum("bqhd,bkhd->bhqk", do, v_up)
    if mode == "sigmoid":
        bias = sigmoid_bias if sigmoid_bias is not None else default_sigmoid_bias(s_k)
        p = (score_fn(x).to(dtype) if score_fn is not None else torch.sigmoid(x + bias)).masked_fill(~allowed, 0)
        if score_grad_fn is not None:
            dpdx = score_grad_fn(x).to(dtype)
        else:
            sig = torch.sigmoid(x + bias)
            dpdx = sig * (1 - sig)
        dx = (dp * dpdx).masked_fill(~allowed, 0)
    else:
        logits, dcap = x, None
        if mode == "softcap":
            logits = score_fn(x).to(dtype) if score_fn is not None else softcap * torch.tanh(x / softcap)
            dcap = score_grad_fn(x).to(dtype) if score_grad_fn is not None else 1 - torch.tanh(x / softcap) ** 2
        elif score_fn is not None:   # a user score_mod: its logits and d logit / dx
            logits = score_fn(x).to(dtype)
            dcap = score_grad_fn(x).to(dtype)
        p, _ = softmax_rows(logits.masked_fill(~allowed, float("-inf")))
        if out is not None:
            d_row = torch.einsum("bqhd,bqhd->bhq", do, out.to(dtype))[..., None]
        else:
            d_row = (p * dp).sum(-1, keepdim=True)  # = rowsum(dO * O) of the exact O
        dx = p * (dp - d_row)
        if dcap is not None:
            dx = dx * dcap
    dq = torch.einsum("bhqk,bkhd->bqhd", dx, k_up) * scale
    dk = torch.einsum("bhqk,bqhd->bkhd", dx, q.to(dtype)) * scale
    dv = torch.einsum("bhqk,bqhd->bkhd", p, do)
    fold = lambda t: t.reshape(t.shape[0], t.shape[1], h_kv, grp, t.shape[3]).sum(3)
    return dq.contiguous(), fold(dk).contiguous(), fold(dv).contiguous()
