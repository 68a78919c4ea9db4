"""Run one tests/cases.py Case through attention() and judge it by the FlashAttention rule.

For each checked tensor T (the output O, the LSE where the mode has one, dQ, dK, dV):

    max |T - T_ref| <= 2 x max |T_torch - T_ref| + floor

T_ref: the FP64 reference (flash_attn_poly.reference.attention_ref, and its explicit backward
with the exact D = rowsum(dO o O)).  T_torch: the same math in torch at the input precision,
the way a FlashAttention kernel does it: forward = reference.attention_ref_lowprec (FP32
scores, P rounded to the input dtype for the PV product); backward = lowprec_backward below
(P and dS rounded to the input dtype before their GEMMs, D from the low-precision O, FP32
accumulation, gradients rounded at the end).  Poly evaluators are judged against the exact
function like native ones (issue 26: the poly defaults must pass the same rule).

floor: eps(dtype) / 8 x max |T_ref| (a quarter of the rounding of the largest element: where
torch's own error is ~0, e.g. O = V at S_k = 1) plus 2^-22 x max |T|_abs, T computed in FP64
from the absolute values of its terms (magnitudes below: where the exact answer cancels to ~0,
e.g. dQ and dK at S_k = 1, both sides are FP32 accumulation noise at that scale); for dQ and dK
of the softmax-like scores plus DTERM_SIGMAS standard deviations of the D term's error
(_dterm_sigmas: O's error of torch's size moves D = rowsum(dO o O), hence every dS of the row;
at a handful of keys that one realisation decides the max error, and torch's is another);
for the LSE eps(dtype), absolute (an LSE off by d scales every P the backward recomputes by
e^d, as a program's logit error d does for its column; d within two roundings of P in the input
dtype is what an O that passes the rule allows, where torch's FP32 LSE error is ~1e-6).
A non-finite value, or an LSE -inf pattern that differs from the reference's
(rows that see no key), never passes.

`run_case(case, backend)` returns a record (JSON-able dict: the case, per tensor the error,
torch's error, the floor and ratio = err / (2 x torch_err + floor), status); `check` also
raises AssertionError naming every tensor over its bound.  backend="reference" runs the
whole path on the CPU (tests/test_correctness_cpu.py), "cuda" the kernels.
"""
from __future__ import annotations

import math
import time

import torch
from cases import KNOWN_DEFECTS

# the rule itself: one implementation, in the package, re-exported here
from flash_attn_poly.testing import (DTERM_SIGMAS, FACTOR, FLOOR_EPS_FRACTION, FP32_NOISE,  # noqa: F401
                                     LSE_FLOOR_EPS_FRACTION, floor_for, judge, max_err)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


# ----------------------------------------------------------------------------- inputs
def _randn(shape, g, device):
    return torch.randn(*shape, generator=g, device=device, dtype=torch.float32)


def make_inputs(case, device="cuda"):
    """(q, k, v, dout) of the case in its layout: q, k, v are views of leaf tensors that require
    grad ("packed_qkv": slices of one (B, S, H_q + 2 H_kv, D) projection, or q alone and k/v
    slices of one (B, S_k, 2 H_kv, D) when S_q != S_k; "transposed": (B, H, S, D) storage seen
    as (B, S, H, D); "paddedN": head stride D + N), dout contiguous.  Softcap: q scaled by
    cap / 4 so the scores reach the cap (flash-attn's test does the same)."""
    dt = DTYPES[case.dtype]
    g = torch.Generator(device=device).manual_seed(case.seed)
    b, s_q, s_k, hq, hkv, d = case.batch, case.seqlen_q, case.seqlen_k, case.hq, case.hkv, case.head_dim
    amp = case.softcap / 4 if case.mode == "softcap" else 1.0

    def leaf(t):
        return t.to(dt).requires_grad_()

    if case.layout == "contiguous":
        q, k, v = (leaf(_randn((b, s, h, d), g, device) * a)
                   for s, h, a in ((s_q, hq, amp), (s_k, hkv, 1.0), (s_k, hkv, 1.0)))
    elif case.layout == "packed_qkv":
        if s_q == s_k:
            base = _randn((b, s_q, hq + 2 * hkv, d), g, device)
            base[:, :, :hq] *= amp
            base = leaf(base)
            q, k, v = base[:, :, :hq], base[:, :, hq:hq + hkv], base[:, :, hq + hkv:]
        else:
            q = leaf(_randn((b, s_q, hq, d), g, device) * amp)
            kv = leaf(_randn((b, s_k, 2 * hkv, d), g, device))
            k, v = kv[:, :, :hkv], kv[:, :, hkv:]
    elif case.layout == "transposed":
        q, k, v = (leaf(_randn((b, h, s, d), g, device) * a).transpose(1, 2)
                   for s, h, a in ((s_q, hq, amp), (s_k, hkv, 1.0), (s_k, hkv, 1.0)))
    elif case.layout.startswith("padded"):
        pad = int(case.layout[len("padded"):])
        q, k, v = (leaf(_randn((b, s, h, d + pad), g, device) * a)[..., :d]
                   for s, h, a in ((s_q, hq, amp), (s_k, hkv, 1.0), (s_k, hkv, 1.0)))
    else:
        raise ValueError(f"layout must be contiguous, packed_qkv, transposed or paddedN, got {case.layout!r}")
    dout = _randn((b, s_q, hq, d), g, device).to(dt)
    return q, k, v, dout


# ----------------------------------------------------------------------------- torch at input precision
def _probs(q, k, mode, dtype, *, causal, softcap=None, window_size=(-1, -1), sigmoid_bias=None,
           softmax_scale=None, score_fn=None, score_grad_fn=None):
    """(p, dfac, scale) in dtype from q, k: P (0 where a key is masked) and the factor between dP
    and dS: d logit/dx for softcap or a score_fn (None for plain softmax), dp/dx for sigmoid."""
    from flash_attn_poly import reference as R
    s_q, s_k = q.shape[1], k.shape[1]
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    x = R.scores(q, k, scale, dtype)
    allowed = R.window_mask(s_q, s_k, *window_size, device=q.device)
    if causal:
        allowed &= R.causal_mask(s_q, s_k, device=q.device)
    if mode == "sigmoid":
        bias = sigmoid_bias if sigmoid_bias is not None else R.default_sigmoid_bias(s_k)
        sig = score_fn(x).to(dtype) if score_fn is not None else torch.sigmoid(x + bias)
        dsig = score_grad_fn(x).to(dtype) if score_grad_fn is not None else sig * (1 - sig)
        return sig.masked_fill(~allowed, 0.0), dsig.masked_fill(~allowed, 0.0), scale
    logits, dcap = x, None
    if score_fn is not None:
        logits = score_fn(x).to(dtype)
        dcap = score_grad_fn(x).to(dtype) if score_grad_fn is not None else None
    elif mode == "softcap":
        t = torch.tanh(x / softcap)
        logits, dcap = softcap * t, 1 - t * t
    p, _ = R.softmax_rows(logits.masked_fill(~allowed, float("-inf")))
    return p, dcap, scale


def _expand(t, grp):
    from einops import repeat
    return repeat(t, "b s h d -> b s (h g) d", g=grp)


def _fold(t, h_kv):
    return t.reshape(t.shape[0], t.shape[1], h_kv, t.shape[2] // h_kv, t.shape[3]).sum(3)


def lowprec_backward(dout, q, k, v, out, mode, **kw):
    """(dq, dk, dv) in the input dtype by a FlashAttention backward's math in torch: FP32 scores
    and P (exact functions), dV = P^T dO with P rounded to the input dtype, dP = dO V^T in FP32,
    dS = P (dP - D) (softmax modes, D = rowsum(dO o out) of the low-precision out; softcap times
    d logit / dx) or dP sigma' (sigmoid), rounded to the input dtype, dQ = dS K and dK = dS^T Q
    with FP32 accumulation, each gradient rounded to the input dtype.  kw: causal, softcap,
    window_size, sigmoid_bias, softmax_scale, and score_fn / score_grad_fn (as for
    reference.attention_ref_backward: a replayed program) for the exact score function and its
    derivative."""
    dt, h_kv = q.dtype, k.shape[2]
    grp = q.shape[2] // h_kv
    p, dfac, scale = _probs(q, k, mode, torch.float32, **kw)
    do = dout.float()
    dp = torch.einsum("bqhd,bkhd->bhqk", do, _expand(v, grp).float())
    if mode == "sigmoid":
        ds = dp * dfac
    else:
        ds = p * (dp - torch.einsum("bqhd,bqhd->bhq", do, out.float())[..., None])
        if dfac is not None:
            ds = ds * dfac
    p_lp, ds_lp = p.to(dt).float(), ds.to(dt).float()
    dq = torch.einsum("bhqk,bkhd->bqhd", ds_lp, _expand(k, grp).float()) * scale
    dk = _fold(torch.einsum("bhqk,bqhd->bkhd", ds_lp, q.float()) * scale, h_kv)
    dv = _fold(torch.einsum("bhqk,bqhd->bkhd", p_lp, do), h_kv)
    return dq.to(dt), dk.to(dt), dv.to(dt)


def magnitudes(dout, q, k, v, out, mode, o_only=False, o_low=None, **kw) -> dict:
    """max over elements of O, dQ, dK, dV computed in FP64 with every term's absolute value (dP
    as |dO| |V|^T, D as rowsum(|dO| |O|), |d logit/dx|): the scale FP32 accumulation rounds at,
    which bounds what it can leave where the exact result cancels to ~0 (dQ, dK at S_k = 1).
    o_only: {"o": ...} alone (dout unused)."""
    h_kv = k.shape[2]
    grp = q.shape[2] // h_kv
    p, dfac, scale = _probs(q, k, mode, torch.float64, **kw)
    mx = lambda t: t.max().item() if t.numel() else 0.0
    if o_only:
        return {"o": mx(torch.einsum("bhqk,bkhd->bqhd", p, _expand(v, grp).double().abs()))}
    do, q64, k64, v64 = (t.double().abs() for t in (dout, q, _expand(k, grp), _expand(v, grp)))
    dp = torch.einsum("bqhd,bkhd->bhqk", do, v64)
    if mode == "sigmoid":
        a = dp * dfac.abs()
    else:
        a = p * (dp + torch.einsum("bqhd,bqhd->bhq", do, out.double().abs())[..., None])
        if dfac is not None:
            a = a * dfac.abs()
    out_mag = {"o": mx(torch.einsum("bhqk,bkhd->bqhd", p, v64)),
               "dq": mx(torch.einsum("bhqk,bkhd->bqhd", a, k64) * scale),
               "dk": mx(_fold(torch.einsum("bhqk,bqhd->bkhd", a, q64) * scale, h_kv)),
               "dv": mx(_fold(torch.einsum("bhqk,bqhd->bkhd", p, do), h_kv))}
    out_mag["dq_dterm"] = out_mag["dk_dterm"] = 0.0
    if mode != "sigmoid" and o_low is not None:
        out_mag.update(_dterm_sigmas(dout, q, k, out, o_low, p, dfac, scale, grp, h_kv))
    return out_mag


def _dterm_sigmas(dout, q, k, out, o_low, p, dfac, scale, grp, h_kv) -> dict:
    """{"dq_dterm", "dk_dterm"}: the largest standard deviation over the elements of dQ / dK of
    what another realisation of O's error does through D_i = rowsum(dO o O)_i, in FP64.  Each O
    element off by torch's own O error e = o_low - O_ref with a random sign (not eps |O|: at
    S_k = 1 O = V is exact in both, and that form was 600x torch's gradient error there):
    std(dD_i) = sqrt(sum_d (dO_id e_id)^2); dS_ij moves by -w_ij dD_i with w = P d logit/dx, so
    dQ_i moves by -scale dD_i sum_j w_ij K_j (one draw per row: the signed sum) and dK_j by
    -scale sum_i w_ij dD_i Q_i (independent rows: variances add, over the GQA group's heads too).
    docs/MEASURED.md rule-dterm has the calibration (DTERM_SIGMAS)."""
    do, e = dout.double(), o_low.double() - out.double()
    sig_d = torch.einsum("bqhd,bqhd->bhq", do * do, e * e).sqrt()   # (b, h, q)
    w = p if dfac is None else p * dfac
    mx = lambda t: t.max().item() if t.numel() else 0.0
    wk = torch.einsum("bhqk,bkhd->bqhd", w, _expand(k, grp).double())
    dq = mx(scale * sig_d.transpose(1, 2)[..., None] * wk.abs())
    var_k = torch.einsum("bhqk,bqhd->bkhd", (w * sig_d[..., None]) ** 2, q.double() ** 2) * scale ** 2
    dk = mx(_fold(var_k, h_kv).sqrt())
    return {"dq_dterm": dq, "dk_dterm": dk}


def _device_name(backend: str) -> str:
    if backend == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu"


def case_fields(case, backend: str) -> dict:
    rec = {"tier": case.tier, "backend": backend, "device": _device_name(backend), "id": case.id, "variant": case.variant.name, "mode": case.mode,
           "evaluator": case.evaluator, "dtype": case.dtype, "head_dim": case.head_dim,
           "causal": case.causal, "window": list(case.window_size), "layout": case.layout,
           "shape": [case.batch, case.seqlen_q, case.seqlen_k, case.hq, case.hkv],
           "softcap": case.softcap, "seed": case.seed}
    if case.id in KNOWN_DEFECTS:   # a strict xfail: the collector reports it apart from new failures
        rec["known_defect"] = KNOWN_DEFECTS[case.id]
    return rec


def judge_case(case, q, k, v, dout, out, lse, grads, score_fn=None, score_grad_fn=None,
               directions=("fwd", "bwd")) -> dict:
    """{name: judge(...)} of a case's O, LSE (softmax modes) and (dq, dk, dv) against the FP64
    reference and torch at the input precision (module docstring).  score_fn / score_grad_fn:
    the score function (and its derivative) the references compute instead of the exact one (a
    plan's program replay, tests/plan_reference.py: for tests of named programs, poly splits and
    grad rules); directions: "fwd" judges O and LSE, "bwd" dQ, dK, dV (out then is the O the
    backward was fed)."""
    from flash_attn_poly import reference as R
    kw = case.kwargs()
    fns = {} if score_fn is None else {"score_fn": score_fn}
    gfns = dict(fns, **({} if score_grad_fn is None else {"score_grad_fn": score_grad_fn}))
    qd, kd, vd = (t.detach() for t in (q, k, v))
    dt = DTYPES[case.dtype]
    checks = {}
    with torch.no_grad():
        ref, ref_lse = R.attention_ref(qd, kd, vd, case.mode, **kw, **fns)
        low, low_lse = R.attention_ref_lowprec(qd, kd, vd, case.mode, **kw, **fns)
        mag = magnitudes(dout, qd, kd, vd, ref, case.mode, o_only="bwd" not in directions, o_low=low, **kw, **gfns)
        if "fwd" in directions:
            checks["o"] = judge("o", out, ref, low, dt, mag["o"])
            if case.mode != "sigmoid":
                checks["lse"] = judge("lse", lse, ref_lse, low_lse, dt)
        if "bwd" in directions:
            ref_g = R.attention_ref_backward(dout, qd, kd, vd, case.mode, **kw, **gfns)
            low_g = lowprec_backward(dout, qd, kd, vd, low, case.mode, **kw, **gfns)
            for name, got, r, lo in zip(("dq", "dk", "dv"), grads, ref_g, low_g):
                floor = floor_for(name, r, dt, mag[name]) + DTERM_SIGMAS * mag.get(f"{name}_dterm", 0.0)
                checks[name] = judge(name, got, r, lo, dt, floor=floor)
    return checks


def run_case(case, backend: str = "cuda", device: str = None) -> dict:
    """Forward and backward of attention() on the case's inputs, each tensor judged by the rule.
    Returns the record; status "passed" or "failed" (an exception propagates)."""
    import flash_attn_poly
    device = device or ("cuda" if backend == "cuda" else "cpu")
    t0 = time.perf_counter()
    q, k, v, dout = make_inputs(case, device)
    kw = case.kwargs()
    has_lse = case.mode != "sigmoid"
    res = flash_attn_poly.attention(q, k, v, case.mode, evaluator=case.evaluator, backend=backend,
                                    return_lse=has_lse, **kw)
    out, lse = res if has_lse else (res, None)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    checks = judge_case(case, q, k, v, dout, out, lse, grads)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    rec = case_fields(case, backend)
    rec["checks"] = checks
    rec["status"] = "passed" if all(c["ok"] for c in checks.values()) else "failed"
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def failures(rec: dict) -> list:
    return [f"{n}: {c['why']}" for n, c in rec.get("checks", {}).items() if not c["ok"]]


def check(case, backend: str = "cuda", recorder=None) -> dict:
    """run_case, hand the record to recorder (even when the case fails or raises), then raise
    AssertionError naming every tensor over its bound."""
    try:
        rec = run_case(case, backend)
    except Exception as e:
        if recorder is not None:
            rec = case_fields(case, backend)
            rec.update(status="error", message=f"{type(e).__name__}: {str(e)[:500]}")
            recorder(rec)
        raise
    if recorder is not None:
        recorder(rec)
    bad = failures(rec)
    if bad:
        raise AssertionError(f"{case.id}: " + "; ".join(bad))
    return rec


# ----------------------------------------------------------------------------- records
def recorder_for(tier: str):
    """A function that appends a record as one JSON line to $FAP_CORRECTNESS_OUT/<tier>-shard<i>of<n>.jsonl
    (FAP_CORRECTNESS_OUT: a directory, created if missing), or None when the variable is unset."""
    import json
    import os
    import cases
    root = os.environ.get("FAP_CORRECTNESS_OUT", "").strip()
    if not root:
        return None
    i, n = cases.parse_shard()
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, f"{tier}-shard{i}of{n}.jsonl")

    def record(rec: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(rec, allow_nan=True) + "\n")

    return record
