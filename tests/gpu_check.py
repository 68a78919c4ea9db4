"""One catalogue case through the kernels of a (possibly overridden) plan, judged by the rule.

The mechanism tests (tests/test_attn_fwd_gpu.py, test_attn_bwd_gpu.py, test_api_gpu.py,
test_window_gpu.py) keep what the catalogue (tests/test_correctness_gpu.py: every variant's
default plan through attention()) does not run: plan overrides (poly splits, row-sum order,
constant or online max, rescale threshold, dq_async, lpt, head_loop), named programs and grad
rules, special inputs (fixed-max range ends, rising scores), exactness.  Each is a `Run`: a
catalogue case (tests/cases.py: shapes, layout, score, seed) plus what the test changes.  Its
inputs come from the case's seed (rule_harness.make_inputs), and every tensor is judged by the
one rule (flash_attn_poly.testing.judge through rule_harness.judge_case) against the FP64
reference of the function the plan computes: the exact function for a native score, the
replay of the plan's program, split and grad rule for a poly one (tests/plan_reference.py).

Backends (env FAP_TEST_BACKEND):
    cuda       (default) the kernels: kernels.dispatch with the plan, NaN-poisoned O and LSE
    reference  a CPU dry run: the plan is resolved as on an H200 (132 SMs) and its function runs
               in FP32 torch where the kernels would; everything but the CUDA launch runs (plan
               overrides accepted, inputs, references, the rule).  tests/conftest.py then runs the
               GPU tests of the files that set HONORS_TEST_BACKEND = True instead of skipping them.

`Run.builds()` names the kernel builds (compile keys) a run compiles without a GPU, so
tests/test_gpu_runs_cpu.py counts what these files cost on the GPU machine (~10-20 s a build).
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Optional

import torch

import cases
import rule_harness as H

BACKENDS = ("cuda", "reference")


def backend() -> str:
    """FAP_TEST_BACKEND: "cuda" (default) or "reference" (the CPU dry run)."""
    b = os.environ.get("FAP_TEST_BACKEND", "").strip() or "cuda"
    if b not in BACKENDS:
        raise ValueError(f"FAP_TEST_BACKEND must be one of {BACKENDS}, got {b!r}")
    return b


def device() -> str:
    return "cuda" if backend() == "cuda" else "cpu"


INPUTS = ("case", "saturate_minus", "saturate_plus", "rising")


@dataclasses.dataclass(frozen=True)
class Run:
    """A catalogue case and what a mechanism test changes about it.

    overrides: plan overrides as sorted (key, value) pairs (flash_attn_poly.plan.resolve);
    program / sigmoid_grad: attention()'s arguments; fwd / bwd: which kernels run and are
    judged (bwd alone: the backward is fed the FP64 reference's O, rounded, and LSE, so only its
    own error is measured, and no forward build is compiled); path: "kernels" (dispatch with the
    plan) or "api" (flash_attn_poly.attention and autograd); inputs: "case" (the case's seeded
    inputs), "saturate_minus" / "saturate_plus" (every score of a row near -/+ a large logit:
    the ends of softcap's constant-max range), "rising" (keys scaled up towards the first key,
    which a causal forward visits last: every block raises the row max)."""
    case: cases.Case
    overrides: tuple = ()
    program: Optional[str] = None
    sigmoid_grad: Optional[str] = None
    fwd: bool = True
    bwd: bool = True
    path: str = "kernels"
    inputs: str = "case"

    def __post_init__(self):
        if self.inputs not in INPUTS:
            raise ValueError(f"Run.inputs must be one of {INPUTS}, got {self.inputs!r}")
        if self.path not in ("kernels", "api"):
            raise ValueError(f"Run.path must be 'kernels' or 'api', got {self.path!r}")
        if not (self.fwd or self.bwd) or (self.path == "api" and not self.fwd):
            raise ValueError("a Run runs the forward, the backward or both (the api path: the forward)")

    @property
    def id(self) -> str:
        parts = [self.case.id]
        for k, v in self.overrides:
            v = "of".join(map(str, v)) if isinstance(v, tuple) else (int(v) if isinstance(v, bool) else v)
            parts.append(f"{k}={v}")
        if self.program:
            parts.append(f"prog={self.program}")
        if self.sigmoid_grad:
            parts.append(f"sgrad={self.sigmoid_grad}")
        if not (self.fwd and self.bwd):
            parts.append("fwd" if self.fwd else "bwd")
        if self.path != "kernels":
            parts.append(self.path)
        if self.inputs != "case":
            parts.append(self.inputs)
        return "-".join(parts)

    def call_kw(self) -> dict:
        """attention()'s options (besides mode and evaluator) for this run."""
        kw = self.case.kwargs()
        if self.program is not None:
            kw["program"] = self.program
        if self.sigmoid_grad is not None:
            kw["sigmoid_grad"] = self.sigmoid_grad
        return kw

    def plan(self, q=None, k=None, v=None):
        """The plan the run's kernels follow (default: meta tensors, an H200's 132 SMs)."""
        from flash_attn_poly import testing
        if q is None:
            q, k, v = meta_qkv(self.case)
        return testing.plan_for(q, k, v, self.case.mode, self.case.evaluator, dict(self.overrides),
                                **self.call_kw())

    def builds(self) -> frozenset:
        """The kernel builds this run compiles (forward and / or backward compile keys)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # a named program outside the rule warns
            p = self.plan()
        return frozenset(({("fwd", p.fwd)} if self.fwd else set()) | ({("bwd", p.bwd)} if self.bwd else set()))


def run(case, **kw) -> Run:
    """Run(case, ...) with overrides given as a dict."""
    ov = kw.pop("overrides", None) or {}
    return Run(case, tuple(sorted(ov.items())), **kw)


def meta_qkv(case):
    dt = H.DTYPES[case.dtype]
    return tuple(torch.empty(case.batch, s, h, case.head_dim, dtype=dt, device="meta")
                 for s, h in ((case.seqlen_q, case.hq), (case.seqlen_k, case.hkv), (case.seqlen_k, case.hkv)))


def builds_of(runs) -> frozenset:
    return frozenset().union(*(r.builds() for r in runs)) if runs else frozenset()


# ----------------------------------------------------------------------------- inputs
def inputs(r: Run, dev: Optional[str] = None):
    """(q, k, v, dout) of the run, detached (the kernels take plain tensors), seeded by the case."""
    dev = dev or device()
    c = r.case
    q, k, v, dout = (t.detach() for t in H.make_inputs(c, dev))
    if r.inputs == "rising":
        # scores that grow towards the first keys (visited last by a causal forward): the row
        # max rises block after block, by more or less than a rescale threshold
        ramp = 1.0 + 6.0 * (1.0 - torch.arange(c.seqlen_k, device=dev) / c.seqlen_k)
        k = (k.float() * ramp[None, :, None, None]).to(k.dtype)
        q = (q.float() * 2.0).to(q.dtype)
    elif r.inputs.startswith("saturate"):
        # q along -+1, k along +1 plus noise: every capped logit of a row sits at -c or +c, the
        # ends of the constant max's range (p ~ e^-80 or e^20)
        sign = -1.0 if r.inputs == "saturate_minus" else 1.0
        g = torch.Generator(device=dev).manual_seed(c.seed)
        dt = H.DTYPES[c.dtype]
        rand = lambda s, h: torch.rand(c.batch, s, h, c.head_dim, device=dev, generator=g)
        q = (sign * (4.0 + rand(c.seqlen_q, c.hq))).to(dt)
        k = (4.0 + rand(c.seqlen_k, c.hkv)).to(dt)
        v = torch.randn(c.batch, c.seqlen_k, c.hkv, c.head_dim, device=dev, generator=g).to(dt)
    return q, k, v, dout


# ----------------------------------------------------------------------------- running
def _ref_forward(case, q, k, v, fn, dtype):
    from flash_attn_poly import reference as R
    kw = dict(case.kwargs(), **({} if fn is None else {"score_fn": fn}))
    o, lse = R.attention_ref(q, k, v, case.mode, dtype=dtype, **kw)
    return o.to(q.dtype), (None if lse is None else lse.float())


def _ref_backward(case, dout, q, k, v, fn, gfn):
    from flash_attn_poly import reference as R
    kw = dict(case.kwargs(), **({} if fn is None else {"score_fn": fn}),
              **({} if gfn is None else {"score_grad_fn": gfn}))
    grads = R.attention_ref_backward(dout, q, k, v, case.mode, dtype=torch.float32, **kw)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (q, k, v)))


def _score_fns(p):
    """(fn, gfn) of the plan's forward score and (fn_bwd, gfn_bwd) of its backward score: the
    same pair where the backward recomputes P with the forward's spec."""
    import plan_reference
    fn, gfn = plan_reference.score_fns(p)
    return (fn, gfn) + ((fn, gfn) if p.score_bwd == p.score else plan_reference.score_fns(p, side="bwd"))


def execute(r: Run, qkvd=None):
    """Run the kernels (or the reference stand-in) on the run's inputs.  Returns a dict: plan,
    q, k, v, dout, o, lse (what the backward was fed where fwd is False), grads (or None), and
    the plan's score functions fn, gfn (None for a native score) and its backward score's
    fn_bwd, gfn_bwd."""
    from flash_attn_poly import testing
    be = backend()
    q, k, v, dout = qkvd if qkvd is not None else inputs(r)
    if r.path == "api":
        return _execute_api(r, q, k, v, dout)
    p = r.plan(q, k, v)
    fn, gfn, fn_b, gfn_b = _score_fns(p)
    if r.fwd:
        if be == "cuda":
            o, lse = testing.forward_poisoned(p, q, k, v)
        else:
            o, lse = _ref_forward(r.case, q, k, v, fn, torch.float32)
    else:   # the backward alone: fed the FP64 reference's O (rounded) and LSE
        o, lse = _ref_forward(r.case, q, k, v, fn, torch.float64)
    grads = None
    if r.bwd:
        if be == "cuda":
            grads = testing.run_backward(p, dout, q, k, v, o, lse)
        else:
            grads = _ref_backward(r.case, dout, q, k, v, fn_b, gfn_b)
    if be == "cuda":
        torch.cuda.synchronize()
    return dict(plan=p, q=q, k=k, v=v, dout=dout, o=o, lse=lse, grads=grads, fn=fn, gfn=gfn, fn_bwd=fn_b,
                gfn_bwd=gfn_b)


def _execute_api(r: Run, q, k, v, dout):
    """flash_attn_poly.attention(..., backend="cuda") and autograd; the reference backend runs
    attention(backend="reference") where the plan's score is native and the plan's function in
    FP32 where it is a program (the reference backend computes exact functions only)."""
    import flash_attn_poly
    be = backend()
    c = r.case
    p = r.plan(q, k, v)
    fn, gfn, fn_b, gfn_b = _score_fns(p)
    has_lse = c.mode != "sigmoid"
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    if be == "cuda" or fn is None:
        res = flash_attn_poly.attention(qg, kg, vg, c.mode, evaluator=c.evaluator, backend=be,
                                        return_lse=has_lse, **r.call_kw())
        o, lse = res if has_lse else (res, None)
        grads = torch.autograd.grad(o, (qg, kg, vg), dout) if r.bwd else None
        o = o.detach()
    else:
        o, lse = _ref_forward(c, q, k, v, fn, torch.float32)
        grads = _ref_backward(c, dout, q, k, v, fn_b, gfn_b) if r.bwd else None
    if be == "cuda":
        torch.cuda.synchronize()
    return dict(plan=p, q=q, k=k, v=v, dout=dout, o=o, lse=lse, grads=grads, fn=fn, gfn=gfn, fn_bwd=fn_b,
                gfn_bwd=gfn_b)


def judge(r: Run, res: dict) -> dict:
    """The rule on every tensor the run produced (O and LSE where the forward ran, dQ, dK, dV
    where the backward ran), against the FP64 reference of the plan's function."""
    grads = res["grads"] if res["grads"] is not None else (None,) * 3
    judge_dirs = lambda fn, gfn, dirs: H.judge_case(r.case, res["q"], res["k"], res["v"], res["dout"], res["o"],
                                                   res["lse"], grads, fn, gfn, dirs)
    if res["plan"].score_bwd == res["plan"].score:   # one function: one reference for both directions
        return judge_dirs(res["fn"], res["gfn"], (("fwd",) if r.fwd else ()) + (("bwd",) if r.bwd else ()))
    # the backward against its own score's function (P recomputed on MUFU where the plan says so)
    out = judge_dirs(res["fn"], res["gfn"], ("fwd",)) if r.fwd else {}
    if r.bwd:
        out.update(judge_dirs(res["fn_bwd"], res["gfn_bwd"], ("bwd",)))
    return out


def check(r: Run, qkvd=None) -> dict:
    """execute + judge; raises AssertionError naming every tensor over its bound.  Returns the
    execute() dict with "checks" added."""
    res = execute(r, qkvd)
    res["checks"] = checks = judge(r, res)
    bad = [f"{n}: {c['why']}" for n, c in checks.items() if not c["ok"]]
    if bad:
        raise AssertionError(f"{r.id} ({backend()}): " + "; ".join(bad))
    return res


def params(runs) -> list:
    """pytest params of runs, ids = Run.id."""
    import pytest
    return [pytest.param(r, id=r.id) for r in runs]
