"""attention_varlen on the CPU: the reference backend against an independent packed-token
oracle (one masked computation over all tokens, block-diagonal by sequence), input checks,
autograd, the custom op under torch.compile, and the CUDA path's per-sequence routing (the
kernels stood in by the reference)."""
import dataclasses
import math

import pytest
import torch

import flash_attn_poly as fap
import flash_attn_poly.interface as fi
import flash_attn_poly.varlen as fv


def _packed(lens_q, lens_k, hq=4, hkv=2, d=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, d, generator=g).to(dtype)
    k = torch.randn(tk, hkv, d, generator=g).to(dtype)
    v = torch.randn(tk, hkv, d, generator=g).to(dtype)
    cu = lambda lens: torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    return q, k, v, cu(lens_q), cu(lens_k)


def _oracle(q, k, v, lens_q, lens_k, mode="softmax", causal=True, window=(-1, -1), softcap=None,
            sigmoid_bias=None, scale=None):
    """FP64, autograd-able: all tokens at once, query i of sequence b sees key j of the same
    sequence when j - k0 <= (i - q0) + S_k - S_q (causal) and inside the window, all
    bottom-right aligned per sequence; sigmoid bias -ln S_k of the query's sequence."""
    tq, tk = q.shape[0], k.shape[0]
    seq_q = torch.repeat_interleave(torch.arange(len(lens_q)), torch.tensor(lens_q), output_size=tq)
    seq_k = torch.repeat_interleave(torch.arange(len(lens_k)), torch.tensor(lens_k), output_size=tk)
    cq = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0).tolist()))
    ck = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0).tolist()))
    sq, sk = torch.tensor(lens_q), torch.tensor(lens_k)
    # query i's diagonal in its sequence's key coordinates, as an absolute key row
    diag = (torch.arange(tq) - cq[seq_q]) + (sk[seq_q] - sq[seq_q]) + ck[seq_q]
    j = torch.arange(tk)[None, :]
    ok = seq_q[:, None] == seq_k[None, :]
    if causal:
        ok &= j <= diag[:, None]
    if window[0] >= 0:
        ok &= j >= diag[:, None] - window[0]
    if window[1] >= 0:
        ok &= j <= diag[:, None] + window[1]
    grp = q.shape[1] // k.shape[1]
    kk, vv = k.double().repeat_interleave(grp, 1), v.double().repeat_interleave(grp, 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    x = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    if mode == "sigmoid":
        bias = (-torch.log(sk[seq_q].double().clamp_min(1)))[None, :, None] if sigmoid_bias is None \
            else sigmoid_bias
        p = torch.sigmoid(x + bias) * ok
        return torch.einsum("hqk,khd->qhd", p, vv), None
    if mode == "softcap":
        x = softcap * torch.tanh(x / softcap)
    x = x.masked_fill(~ok, -math.inf)
    lse = torch.logsumexp(x, -1)
    p = torch.exp(x - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", p, vv), lse


LENS = [  # (lens_q, lens_k): empty sequences, single tokens, S_q != S_k both ways
    ([5, 0, 1, 9, 3], [5, 0, 1, 9, 3]),
    ([4, 7, 0, 1, 2], [6, 3, 2, 0, 2]),
    ([1], [1]),
    ([0, 0, 6], [3, 0, 6]),
]
OPTS = [
    ("softmax", dict(causal=True)),
    ("softmax", dict(causal=False)),
    ("softmax", dict(causal=True, window_size=(2, 0))),
    ("softmax", dict(causal=False, window_size=(1, 3))),
    ("softcap", dict(causal=True, softcap=5.0)),
    ("softcap", dict(causal=False, softcap=5.0, window_size=(3, -1))),
    ("sigmoid", dict(causal=True)),
    ("sigmoid", dict(causal=False, sigmoid_bias=-1.5)),
]


@pytest.mark.parametrize("lens_q, lens_k", LENS)
@pytest.mark.parametrize("mode, kw", OPTS)
def test_reference_matches_packed_oracle(lens_q, lens_k, mode, kw):
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, seed=len(lens_q))
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)
    res = fap.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), mode, backend="reference",
                               return_lse=mode != "sigmoid", **kw)
    out, lse = res if mode != "sigmoid" else (res, None)
    ref, ref_lse = _oracle(q, k, v, lens_q, lens_k, mode, kw.get("causal", True), kw.get("window_size", (-1, -1)),
                           kw.get("softcap"), kw.get("sigmoid_bias"))
    assert out.shape == q.shape and out.dtype == q.dtype
    assert (out.double() - ref).abs().max() < 1e-5
    if lse is not None:
        assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), fin)          # -inf exactly where a row sees no key
        assert fin.sum() == 0 or (lse.double()[fin] - ref_lse[fin]).abs().max() < 1e-5
    dout = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), dout)
    want = torch.autograd.grad(ref, (q, k, v), dout.double())
    for name, a, b in zip("qkv", got, want):
        assert (a.double() - b).abs().max() < 1e-5, name


def test_rows_without_keys_are_zero_and_sequences_are_independent():
    lens_q, lens_k = [3, 4, 2], [2, 0, 5]
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, seed=7)
    out, lse = fap.attention_varlen(q, k, v, cu_q, cu_k, 4, 5, causal=False, backend="reference", return_lse=True)
    assert torch.equal(out[3:7], torch.zeros_like(out[3:7]))
    assert (lse[:, 3:7] == -math.inf).all()
    # causal bottom-right with S_q = 3 > S_k = 2: query row 0 sees no key
    out_c, lse_c = fap.attention_varlen(q, k, v, cu_q, cu_k, 4, 5, backend="reference", return_lse=True)
    assert torch.equal(out_c[0], torch.zeros_like(out_c[0])) and (lse_c[:, 0] == -math.inf).all()
    # each sequence equals the dense call on it alone, bit for bit
    for b, (q0, q1, k0, k1) in enumerate([(0, 3, 0, 2), (7, 9, 2, 7)]):
        dense = fap.attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], "sigmoid", causal=False,
                              backend="reference")
        vl = fap.attention_varlen(q, k, v, cu_q, cu_k, 4, 5, "sigmoid", causal=False, backend="reference")
        assert torch.equal(vl[q0:q1], dense[0]), b


def test_sigmoid_default_bias_is_per_sequence():
    """Two sequences of different S_k: bias -ln S_k of each, not of the batch's total or max."""
    lens = [3, 12]
    q, k, v, cu_q, cu_k = _packed(lens, lens, seed=3)
    out = fap.attention_varlen(q, k, v, cu_q, cu_k, 12, 12, "sigmoid", causal=False, backend="reference")
    for s, (q0, q1) in zip(lens, [(0, 3), (3, 15)]):
        k0, k1 = q0, q1
        want = fap.attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], "sigmoid", causal=False,
                             sigmoid_bias=-math.log(s), backend="reference")[0]
        other = fap.attention(q[None, q0:q1], k[None, k0:k1], v[None, k0:k1], "sigmoid", causal=False,
                              sigmoid_bias=-math.log(15), backend="reference")[0]
        assert torch.equal(out[q0:q1], want)
        assert not torch.allclose(out[q0:q1], other)


def test_bf16_inputs_and_gqa_grad_shapes():
    q, k, v, cu_q, cu_k = _packed([5, 1, 0, 8], [5, 1, 0, 8], hq=6, hkv=2, d=64, dtype=torch.bfloat16, seed=4)
    for t in (q, k, v):
        t.requires_grad_(True)
    out = fap.attention_varlen(q, k, v, cu_q, cu_k, 8, 8, "softcap", softcap=10.0, backend="reference")
    ref, _ = _oracle(q.detach(), k.detach(), v.detach(), [5, 1, 0, 8], [5, 1, 0, 8], "softcap", softcap=10.0)
    assert out.dtype == torch.bfloat16 and (out.double() - ref).abs().max() < 2e-2
    out.float().square().sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


# ------------------------------------------------------------------------------ input checks
def _good():
    q, k, v, cu_q, cu_k = _packed([3, 5], [4, 2], seed=1)
    return dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=5, max_seqlen_k=4)


def _call(**over):
    a = _good()
    a.update(over)
    kw = {key: a.pop(key) for key in list(a) if key not in
          ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")}
    kw.setdefault("backend", "reference")
    return fap.attention_varlen(a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"],
                                a["max_seqlen_k"], **kw)


I32 = dict(dtype=torch.int32)


@pytest.mark.parametrize("over, exc, match", [
    (dict(cu_seqlens_q=torch.tensor([0, 3, 8])), TypeError, "cu_seqlens_q must have dtype torch.int32"),
    (dict(cu_seqlens_k=torch.tensor([0, 4, 6], dtype=torch.int64)), TypeError, "cu_seqlens_k must have dtype"),
    (dict(cu_seqlens_q=[0, 3, 8]), TypeError, "cu_seqlens_q must be a torch.Tensor"),
    (dict(cu_seqlens_q=torch.tensor([[0, 3, 8]], **I32)), ValueError, "cu_seqlens_q must be 1-D"),
    (dict(cu_seqlens_q=torch.tensor([0], **I32)), ValueError, "batch \\+ 1 >= 2"),
    (dict(cu_seqlens_q=torch.tensor([0, 3, 5, 8], **I32)), ValueError, "batch sizes must agree"),
    (dict(cu_seqlens_q=torch.tensor([0, 5, 3], **I32)), ValueError, "non-decreasing"),
    (dict(cu_seqlens_k=torch.tensor([0, 4, 5], **I32)), ValueError, r"cu_seqlens_k\[-1\] = 5 must equal .*\(6\)"),
    (dict(cu_seqlens_q=torch.tensor([1, 3, 8], **I32)), ValueError, r"cu_seqlens_q\[0\] must be 0"),
    (dict(max_seqlen_q=4), ValueError, "max_seqlen_q = 4 is smaller than sequence 1's length 5"),
    (dict(max_seqlen_k=3), ValueError, "max_seqlen_k = 3 is smaller than sequence 0's length 4"),
    (dict(max_seqlen_k=-1), ValueError, "max_seqlen_k must be >= 0"),
    (dict(max_seqlen_q=5.0), TypeError, "max_seqlen_q must be an int"),
    (dict(check_inputs=1), TypeError, "check_inputs must be a bool"),
    (dict(mode="relu"), ValueError, "mode must be"),
    (dict(mode="softcap"), ValueError, "softcap > 0"),
    (dict(mode="sigmoid", return_lse=True), ValueError, "no log-sum-exp"),
    (dict(window_size=(-2, 0)), ValueError, "window_size"),
    (dict(backend="tpu"), ValueError, "backend must be"),
    (dict(backend="fa4"), ValueError, "backend='fa4' does not take packed sequences"),
])
def test_rejects_bad_input(over, exc, match):
    with pytest.raises(exc, match=match):
        _call(**over)


def test_rejects_bad_tensors():
    a = _good()
    with pytest.raises(ValueError, match="3-D"):
        _call(q=a["q"][None])
    with pytest.raises(ValueError, match="multiple"):
        _call(q=a["q"][:, :3])
    with pytest.raises(ValueError, match="head_dim mismatch"):
        _call(k=a["k"][..., :16], v=a["v"][..., :16])
    with pytest.raises(TypeError, match="share one dtype"):
        _call(k=a["k"].double().float().half())
    with pytest.raises(ValueError, match="cu_seqlens_q is on meta"):
        _call(cu_seqlens_q=torch.empty(3, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="head_dim must be > 0"):
        _call(q=a["q"][..., :0], k=a["k"][..., :0], v=a["v"][..., :0])
    with pytest.raises(ValueError, match="q has 0 heads"):
        _call(q=a["q"][:, :0])


def test_check_inputs_false_skips_value_checks():
    """check_inputs=False reads nothing it need not (the reference reads the offsets anyway, but
    does not judge them): a max_seqlen too small passes through."""
    out = _call(max_seqlen_q=1, check_inputs=False)
    assert torch.equal(out, _call())


def test_max_seqlen_accepts_a_0d_tensor():
    """transformers' position_ids path hands max_length as a 0-d tensor."""
    assert torch.equal(_call(max_seqlen_q=torch.tensor(5), max_seqlen_k=torch.tensor(4, dtype=torch.int32)), _call())


# ------------------------------------------------------------------------------ backends, ops
def test_backend_cuda_on_cpu_refuses_and_auto_warns():
    with pytest.raises(ValueError, match="backend='cuda': the CUDA kernels need CUDA tensors"):
        _call(backend="cuda")
    with pytest.warns(UserWarning, match="CUDA tensors"):
        out = _call(backend="auto")
    assert torch.equal(out, _call())


def test_custom_op_opcheck_and_fake_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode
    a = _good()
    args = (a["q"], a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"], 5, 4, "softmax", "poly", True, 0.0,
            math.nan, 0.125, [-1, -1], False, "", "", True, "reference")
    torch.library.opcheck(torch.ops.flash_attn_poly.attn_varlen_fwd.default, args)
    sig = args[:7] + ("sigmoid",) + args[8:]
    torch.library.opcheck(torch.ops.flash_attn_poly.attn_varlen_fwd.default, sig)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in args[:5]]
        out, lse = torch.ops.flash_attn_poly.attn_varlen_fwd(*fake, *args[5:])
        assert out.shape == a["q"].shape and lse.shape == (4, 8)


@pytest.mark.parametrize("mode, kw", [("softmax", {}), ("softcap", {"softcap": 8.0}), ("sigmoid", {})])
def test_torch_compile_fullgraph_equals_eager(mode, kw):
    a = _good()
    q = a["q"].clone().requires_grad_(True)

    def f(q, k, v, cu_q, cu_k):
        return fap.attention_varlen(q, k, v, cu_q, cu_k, 5, 4, mode, backend="reference", **kw).square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    loss = compiled(q, a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"])
    (g,) = torch.autograd.grad(loss, q)
    q2 = a["q"].clone().requires_grad_(True)
    loss2 = f(q2, a["k"], a["v"], a["cu_seqlens_q"], a["cu_seqlens_k"])
    (g2,) = torch.autograd.grad(loss2, q2)
    assert torch.equal(loss, loss2) and torch.equal(g, g2)


def _route(monkeypatch):
    """Stand the kernels in by the reference (dense: per call; varlen: per packed batch) and
    record each launch: ("fwd" | "bwd" | "fwd_varlen" | "bwd_varlen", the plan's call, extra)."""
    from flash_attn_poly import plan as plan_mod
    from flash_attn_poly.kernels import dispatch
    from test_varlen_gpu import varlen_call_of
    launches = []
    monkeypatch.setattr(fi, "plan_for", lambda call, device: plan_mod.resolve(call, 132))
    monkeypatch.setattr(dispatch, "forward", lambda p, q, k, v, aux=(): launches.append(("fwd", p.call, None))
                        or fi._reference_forward(q, k, v, p.call, aux))
    monkeypatch.setattr(dispatch, "backward", lambda p, dout, q, k, v, out, lse, aux=():
                        launches.append(("bwd", p.call, lse.shape)) or fi._reference_backward(dout, q, k, v, p.call))

    def fwd_varlen(vp, q, k, v, cu_q, cu_k, max_q):
        launches.append(("fwd_varlen", vp.call, vp.fwd))
        call = varlen_call_of(vp.call, max_q, vp.call.seqlen_k)
        out, lse = fv._forward(q, k, v, cu_q, cu_k, call, True, "reference")
        return out, (None if vp.call.mode == "sigmoid" else lse)

    def bwd_varlen(vp, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k):
        launches.append(("bwd_varlen", vp.call, vp.bwd))
        return fv._backward(dout, q, k, v, cu_q, cu_k, out, lse, varlen_call_of(vp.call, max_q, max_k), "reference")

    monkeypatch.setattr(dispatch, "forward_varlen", fwd_varlen)
    monkeypatch.setattr(dispatch, "backward_varlen", bwd_varlen)
    return launches


def _cuda_and_reference(mode, kw, lens_q, lens_k, **vkw):
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, d=64, dtype=torch.bfloat16, seed=9)
    dout = torch.randn_like(q)
    res = {}
    for backend in ("cuda", "reference"):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        call = fv.validate(qq, kk, vv, cu_q, cu_k, max(lens_q), max(lens_k), mode, "poly", True, kw.get("softcap"),
                           kw.get("sigmoid_bias"), **vkw)
        out, lse = fv._EagerVarlen.apply(qq, kk, vv, cu_q, cu_k, call, True, backend)
        res[backend] = (out, lse) + torch.autograd.grad(out, (qq, kk, vv), dout)
    for a, b in zip(res["cuda"], res["reference"]):
        assert torch.equal(a, b), mode


def test_cuda_path_runs_one_varlen_launch_per_batch(monkeypatch):
    """backend='cuda' (the kernels stood in by the reference): softmax and softcap run the varlen
    forward and backward kernels, one launch each for the whole batch (the forward persistent;
    the backward a CTA per tile, head and sequence, without the per-KV-head loop); the same result as the reference
    backend, bit for bit."""
    launches = _route(monkeypatch)
    lens_q, lens_k = [3, 0, 5, 2], [4, 2, 5, 0]
    for mode, kw in (("softmax", {}), ("softcap", {"softcap": 20.0}), ("sigmoid", {"sigmoid_bias": -2.0}),
                     ("sigmoid", {})):   # the default bias too: -ln S_k per sequence, added in the kernels
        launches.clear()
        _cuda_and_reference(mode, kw, lens_q, lens_k)
        assert [c[0] for c in launches] == ["fwd_varlen", "bwd_varlen"], mode
        fwd, bwd = launches[0], launches[1]
        assert fwd[1].varlen and fwd[2].varlen and fwd[2].persistent > 0
        assert fwd[1].varlen_ragged and fwd[2].varlen_compact, mode   # ragged: the compact order
        assert bwd[2].varlen and not bwd[2].head_loop and not bwd[2].lpt


def test_plan_takes_the_compact_order_for_ragged_batches_only(monkeypatch):
    """The varlen forward walks the live tiles only (fwd.varlen_compact) when the query lengths
    differ (total_q < batch x max_seqlen_q, read off the shapes); equal lengths keep the slot
    order (docs/MEASURED.md varlen-compact); a table its int32 entries cannot encode keeps it too;
    sigmoid at its per-sequence default bias takes the same order."""
    from flash_attn_poly import plan as plan_mod
    from flash_attn_poly.kernels.tile_scheduler import COMPACT_MAX_SEQS
    launches = _route(monkeypatch)
    for lens, ragged in (([4, 4, 4], False), ([4, 3, 4], True), ([4, 4, 0], True)):
        launches.clear()
        _cuda_and_reference("softmax", {}, lens, lens)
        fwd = launches[0]
        assert fwd[0] == "fwd_varlen" and fwd[1].varlen_ragged == ragged and fwd[2].varlen_compact == ragged, lens
    q, k, v, cu_q, cu_k = _packed([4, 3], [4, 3], d=64, dtype=torch.bfloat16)
    call = fv.validate(q, k, v, cu_q, cu_k, 8, 8, "softmax", "poly", True, None, None)   # overstated max: ragged
    assert call.ragged
    big = dataclasses.replace(fv._attn_call(call), batch=COMPACT_MAX_SEQS + 1)
    assert plan_mod.resolve(fv._attn_call(call), 132).fwd.varlen_compact
    assert plan_mod.resolve(fv._attn_call(call), 132).bwd.varlen
    assert not plan_mod.resolve(big, 132).fwd.varlen_compact
    assert not plan_mod.resolve(big, 132).bwd.varlen   # the backward's CTA table cannot hold it either
    sig = dataclasses.replace(fv._attn_call(call), mode="sigmoid")   # the default bias: the varlen kernels too
    assert plan_mod.resolve(sig, 132).fwd.varlen_compact and plan_mod.resolve(sig, 132).score.seq_bias


def test_cuda_path_routes_each_sequence_through_the_dense_kernels(monkeypatch):
    """Where the varlen kernels do not apply (a deterministic backward needs the dense launch
    order): one dense launch per non-empty sequence, each with the plan of that sequence's dense
    call (batch 1, its own S_q and S_k), and the reference backend's result, bit for bit."""
    launches = _route(monkeypatch)
    lens_q, lens_k = [3, 0, 5, 2], [4, 2, 5, 0]
    launches.clear()
    _cuda_and_reference("softcap", {"softcap": 20.0}, lens_q, lens_k, deterministic=True)
    assert [c[0] for c in launches] == ["fwd_varlen", "bwd", "bwd"]
    assert [c[2] for c in launches[1:]] == [(1, 4, 3), (1, 4, 5)]
    assert all(c[1].deterministic for c in launches[1:])


def test_kernel_path_checks_unchanged_offsets_once(monkeypatch):
    """check_inputs=True on the varlen kernel path copies the offsets to the host once for the same
    tensor objects: a second call skips it; an in-place write (a new version), a new tensor with
    the same values, other maximum lengths or inference-mode offsets check again; bad offsets
    written in place are caught."""
    from flash_attn_poly import plan as plan_mod
    from flash_attn_poly.kernels import dispatch
    monkeypatch.setattr(fi, "plan_for", lambda call, device: plan_mod.resolve(call, 132))
    monkeypatch.setattr(dispatch, "forward_varlen", lambda vp, q, k, v, cu_q, cu_k, max_q: (
        torch.zeros_like(q), torch.zeros(q.shape[1], q.shape[0])))   # the launch: reads no offsets
    copies = []
    real = fv._offsets
    monkeypatch.setattr(fv, "_offsets", lambda *a: copies.append(a[5]) or real(*a))
    monkeypatch.setattr(fv, "_CHECKED", type(fv._CHECKED)())
    lens = [3, 5, 2]
    q, k, v, cu_q, cu_k = _packed(lens, lens, d=64, dtype=torch.bfloat16)
    run = lambda cq, ck, mx=5: fv._forward(q, k, v, cq, ck, fv.validate(q, k, v, cq, ck, mx, mx, "softmax", "poly",
                                                                        True, None, None), True, "cuda")
    run(cu_q, cu_k)
    run(cu_q, cu_k)
    assert copies == [True]
    cu_q.add_(0)                       # an in-place write: a new version
    run(cu_q, cu_k)
    run(cu_q.clone(), cu_k)            # another tensor object with the same values
    run(cu_q, cu_k, mx=6)              # other maximum lengths
    assert copies == [True] * 4
    with torch.inference_mode():
        cq_inf, ck_inf = cu_q.clone(), cu_k.clone()
    run(cq_inf, ck_inf)
    run(cq_inf, ck_inf)
    assert copies == [True] * 6
    cu_q[1] = 9                        # not non-decreasing any more: caught, the version moved
    with pytest.raises(ValueError, match="non-decreasing"):
        run(cu_q, cu_k, mx=9)


def test_varlen_plan_resolves_without_importing_cutlass():
    """The plan is pure Python (a warm process loads compiled kernels without cutlass): resolving a
    ragged packed call, with its table-limit facts, imports no cutlass module (a fresh process)."""
    import subprocess
    import sys
    code = ("import sys, torch\n"
            "from flash_attn_poly import plan, varlen as fv\n"
            "cu = torch.tensor([0, 3, 8], dtype=torch.int32)\n"
            "q, k = torch.randn(8, 4, 64, dtype=torch.bfloat16), torch.randn(8, 2, 64, dtype=torch.bfloat16)\n"
            "c = fv.validate(q, k, k, cu, cu, 5, 5, 'softmax', 'poly', True, None, None)\n"
            "p = plan.resolve(fv._attn_call(c), 132)\n"
            "assert p.fwd.varlen_compact and p.bwd.varlen\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'cutlass'))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
