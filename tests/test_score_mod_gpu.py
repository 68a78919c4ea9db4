"""User score functions on the GPU, forward and backward, by the FlashAttention rule: the
kernel's error against an FP64 reference is at most 2x that of the same math in torch at the
input precision (plus a small floor), for O and for dQ / dK / dV each.  The examples of
flash_attn_poly.score_mod: ALiBi (aux tensor of head slopes), softcap through MUFU tanh and
through the packed polynomial tanh_d4."""
import pytest
import torch
from einops import repeat

import flash_attn_poly
from flash_attn_poly import score_mod as sm
from flash_attn_poly.testing import max_abs_err

pytestmark = pytest.mark.gpu

CASES = [  # (B, S_q, S_k, H_q, H_kv, D, causal)
    (2, 257, 257, 8, 2, 128, True),
    (1, 129, 384, 4, 4, 64, True),    # S_q < S_k: bottom-right causal alignment
    (1, 200, 200, 4, 1, 128, False),
]


def _torch_attention(q, k, v, score, causal, upcast):
    """softmax(score(scale q k^T)) v with GQA and bottom-right causal masking; upcast: in FP64,
    else in the inputs' dtype (scores and softmax in FP32, P rounded to the input dtype)."""
    b, s_q, h_q, d = q.shape
    s_k, h_kv = k.shape[1], k.shape[2]
    dt = torch.float64 if upcast else torch.float32
    kk = repeat(k, "b s h d -> b s (h g) d", g=h_q // h_kv)
    vv = repeat(v, "b s h d -> b s (h g) d", g=h_q // h_kv)
    if upcast:
        x = torch.einsum("bqhd,bkhd->bhqk", q.double(), kk.double()) * d ** -0.5
    else:
        x = torch.einsum("bqhd,bkhd->bhqk", q, kk).to(dt) * d ** -0.5
    x = score(x)
    if causal:
        i = torch.arange(s_q, device=q.device)[:, None]
        j = torch.arange(s_k, device=q.device)[None, :]
        x = x.masked_fill(j > i + (s_k - s_q), float("-inf"))
    p = torch.softmax(x, dim=-1)
    if upcast:
        return torch.einsum("bhqk,bkhd->bqhd", p, vv.double())
    return torch.einsum("bhqk,bkhd->bqhd", p.to(q.dtype), vv)


def _replayed_softcap(cap: float, program: str):
    """The softcap score_mod's math with the program replayed as the kernel runs it (fit/runtime,
    fused order): u = fp32(x * fp32(1/c)), t = block(u) (BF16 in, BF16 out), logit = fp32(t * c)."""
    import numpy as np
    from flash_attn_poly.asm import programs
    from flash_attn_poly.fit import runtime
    entry = programs.entry(program)
    inv, c = np.float32(1.0 / cap), np.float32(cap)

    def ref(x, b, h, q_idx, kv_idx, aux):
        x32 = x.detach().float().cpu().numpy()
        u = (x32 * inv).astype(np.float32).astype(np.float64)
        t = runtime.replay(entry, u, "fused").astype(np.float32)
        return torch.from_numpy((t * c).astype(np.float64)).to(device=x.device, dtype=x.dtype)
    return ref


def _check(mod, aux, case, seed, amp=1.0, score=None):
    b, s_q, s_k, h_q, h_kv, d, causal = case
    g = torch.Generator(device="cuda").manual_seed(seed)
    mk = lambda s, h, a: (torch.randn(b, s, h, d, device="cuda", generator=g) * a).to(torch.bfloat16)
    q, k, v = mk(s_q, h_q, amp), mk(s_k, h_kv, amp), mk(s_k, h_kv, 1.0)
    grids = (torch.arange(b, device="cuda").view(b, 1, 1, 1), torch.arange(h_q, device="cuda").view(1, h_q, 1, 1),
             torch.arange(s_q, device="cuda").view(1, 1, s_q, 1), torch.arange(s_k, device="cuda").view(1, 1, 1, s_k))
    ref_fn = score or mod.reference
    score = lambda x: ref_fn(x, *grids, aux)
    dout = torch.randn(b, s_q, h_q, d, device="cuda", generator=g).to(torch.bfloat16)
    results = {}
    for kind in ("ours", "ref", "low"):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        if kind == "ours":
            out = flash_attn_poly.attention(qq, kk, vv, causal=causal, score_mod=mod, aux_tensors=aux)
            grads = torch.autograd.grad(out, (qq, kk, vv), dout)
        else:
            out = _torch_attention(qq, kk, vv, score, causal, upcast=kind == "ref")
            grads = _grads(out, (qq, kk, vv), dout, score)
        results[kind] = (out,) + grads
    for i, name in enumerate(("O", "dQ", "dK", "dV")):
        ours, ref, low = results["ours"][i], results["ref"][i], results["low"][i]
        assert torch.isfinite(ours).all(), f"{mod.name} {name}: non-finite values"
        err, base = max_abs_err(ours, ref), max_abs_err(low, ref)
        floor = 1e-3 * ref.abs().max().item() + 1e-4
        print(f"{mod.name} {case} {name}: ours {err:.3e}, torch {results['low'][i].dtype} {base:.3e}")
        assert err <= 2 * base + floor, f"{mod.name} {case} {name}: {err:.3e} > 2 x {base:.3e} + {floor:.1e}"


def _grads(out, inputs, dout, score):
    """Gradients of the torch pipelines.  A replayed program has no autograd (numpy): its
    derivative is the score_mod_bwd rule d logit/dx = 1 - (logit/c)^2, applied by a custom
    function that takes the replayed logits' gradient as that factor."""
    return torch.autograd.grad(out, inputs, dout.to(out.dtype))


@pytest.mark.parametrize("case", CASES)
def test_alibi(case):
    aux = [sm.alibi_slopes(case[3]).cuda()]
    _check(sm.alibi(), aux, case, seed=1)


@pytest.mark.parametrize("case", CASES)
def test_softcap_score_mod(case):
    # scores spanning tens of logits so that the cap bites (Gemma-2-like)
    _check(sm.softcap(30.0), [], case, seed=2, amp=3.0)


class _Replayed(torch.autograd.Function):
    """logit = replayed program (no autograd through numpy); d logit / dx = 1 - (logit / c)^2,
    the rule the poly softcap score_mod's derivative applies."""

    @staticmethod
    def forward(ctx, x, fn, cap):
        y = fn(x)
        ctx.save_for_backward(y)
        ctx.cap = cap
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        t = y / ctx.cap
        return g * (1 - t * t), None, None


@pytest.mark.parametrize("case", CASES)
def test_softcap_score_mod_with_the_polynomial_tanh(case):
    """tanh by the packed program tanh_d4: judged against a reference that runs the same
    program (its error against the exact tanh is the program's, not the kernel's)."""
    cap, program = 30.0, "tanh_d4"
    replay = _replayed_softcap(cap, program)
    score = lambda x, b, h, q, kv, aux: _Replayed.apply(x, lambda z: replay(z, b, h, q, kv, aux), cap)
    _check(sm.softcap(cap, program=program), [], case, seed=2, amp=3.0, score=score)


def test_alibi_matters_on_the_gpu():
    """ALiBi's output differs from plain softmax's by much more than the tolerance (the kernel
    did not skip the score_mod)."""
    case = (1, 256, 256, 4, 4, 64, True)
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(1, 256, 4, 64, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    aux = [sm.alibi_slopes(4).cuda() * 4]
    plain = flash_attn_poly.attention(q, k, v)
    biased = flash_attn_poly.attention(q, k, v, score_mod=sm.alibi(), aux_tensors=aux)
    assert (plain.float() - biased.float()).abs().max().item() > 0.05


@pytest.mark.parametrize("shape", [(2, 1300, 1300, 8, 2, 64), (1, 1000, 1100, 4, 4, 64)],
                         ids=lambda s: "-".join(map(str, s)))
def test_alibi_with_q_bottom_equals_top_aligned(shape, monkeypatch):
    """fwd.q_bottom with a user score function (no default row takes it there): ALiBi reads q_idx -
    kv_idx, so a hook fed the shifted tile row instead of the sequence's would change O.  The plan
    with the override against the default (top-aligned) one, O and LSE bit for bit (D = 64's 192 x 128
    tile: S_q = 1300 / 1000 shift by 52 / 152 rows; S_q < S_k in the second)."""
    from flash_attn_poly import interface, plan as plan_mod
    b, s_q, s_k, h_q, h_kv, d = shape
    g = torch.Generator(device="cuda").manual_seed(s_q + d)
    q = torch.randn(b, s_q, h_q, d, device="cuda", generator=g).to(torch.bfloat16)
    k, v = (torch.randn(b, s_k, h_kv, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(2))
    aux = [sm.alibi_slopes(h_q).cuda()]
    run = lambda: flash_attn_poly.attention(q, k, v, causal=True, score_mod=sm.alibi(), aux_tensors=aux,
                                            return_lse=True)
    over = {"fwd.tile_m": 192, "fwd.tile_n": 128, "fwd.num_stages": 3, "fwd.pingpong": True}
    seen = []

    def plan_with(q_bottom):   # interface._plan(call, sms) with the tile and q_bottom overridden
        def plan(call, sms):
            p = plan_mod.resolve(call, sms, {**over, "fwd.q_bottom": q_bottom})
            seen.append(p.fwd.q_bottom)
            return p
        return plan
    with torch.no_grad():
        monkeypatch.setattr(interface, "_plan", plan_with(False))
        o_ref, lse_ref = run()
        monkeypatch.setattr(interface, "_plan", plan_with(True))
        o, lse = run()
    assert seen == [False, True]
    assert torch.isfinite(o).all()
    assert torch.equal(o, o_ref), (o.float() - o_ref.float()).abs().max()
    assert torch.equal(lse, lse_ref)
