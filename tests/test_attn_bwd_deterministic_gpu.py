"""GPU tier: the deterministic backward (the plan of attention(..., deterministic=True)) gives
bitwise-equal dq/dk/dv run to run, and the same accuracy against the FP64 reference as the
default build (kernels/bwd_reduce.py, "Deterministic mode").

Cases cover GQA causal with odd S at both head dims, non-causal (every key block visits
every query block: the longest turn chains), S_q > S_k, sliding windows (ranks start at
n_block_min), and a grid far larger than the GPU's resident CTAs (waits on CTAs that were
dispatched earlier, the deadlock-freedom argument).
Run: python -m pytest -q tests/test_attn_bwd_deterministic_gpu.py (H200)."""
import pytest

torch = pytest.importorskip("torch")

CASES = [  # (B, S_q, S_k, H_q, H_kv, D, causal, window)
    (2, 1000, 1000, 8, 2, 128, True, (-1, -1)),
    (2, 1000, 1000, 8, 2, 64, True, (-1, -1)),
    (1, 777, 777, 8, 2, 128, False, (-1, -1)),
    (1, 411, 300, 4, 2, 128, True, (-1, -1)),
    (1, 1000, 1000, 4, 2, 128, True, (200, -1)),
    (1, 517, 517, 4, 4, 64, False, (100, 37)),
    (2, 2047, 2047, 16, 4, 128, True, (-1, -1)),   # 16 x 16 x 2 = 512 CTAs
    (1, 600, 600, 4, 2, 256, True, (-1, -1)),      # two column chunks: counters per chunk
]
RUNS = 3


def _inputs(case):
    b, sq, sk, hq, hkv, d = case[:6]
    g = torch.Generator(device="cuda").manual_seed(sq * 31 + sk + hq * 7 + d)
    mk = lambda s, h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    return mk(sq, hq), mk(sk, hkv), mk(sk, hkv), mk(sq, hq)


def _rel(got, ref):
    return ((got.double() - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=str)
def test_deterministic_bwd_bitwise_and_accurate(case):
    from flash_attn_poly import reference, testing
    causal, win = case[6], case[7]
    q, k, v, do = _inputs(case)
    kw = dict(causal=causal, window_size=win)
    o, lse = reference.attention_ref(q, k, v, "softmax", **kw)
    o, lse = o.to(q.dtype), lse.float()
    det = testing.plan_for(q, k, v, "softmax", "native", deterministic=True, **kw)
    assert det.bwd.deterministic and not (det.bwd.head_loop or det.bwd.dq_async or det.bwd.lpt), det.bwd
    runs = [testing.run_backward(det, do, q, k, v, o, lse) for _ in range(RUNS)]
    torch.cuda.synchronize()
    for i, grads in enumerate(runs[1:], 1):
        for name, a, b in zip(("dq", "dk", "dv"), runs[0], grads):
            assert torch.equal(a, b), f"{name} of run {i} differs from run 0"
    refs = reference.attention_ref_backward(do, q, k, v, "softmax", **kw)
    default = testing.run_backward(testing.plan_for(q, k, v, "softmax", "native", **kw), do, q, k, v, o, lse)
    for name, got, base, ref in zip(("dq", "dk", "dv"), runs[0], default, refs):
        assert torch.isfinite(got).all(), name
        # as accurate as the default build (same products, only the summation order is fixed)
        assert _rel(got, ref) < 2e-2, (name, _rel(got, ref))
        assert _rel(got, ref) < 2 * _rel(base, ref) + 1e-3, (name, _rel(got, ref), _rel(base, ref))


@pytest.mark.gpu
def test_deterministic_through_the_public_api():
    from flash_attn_poly import attention
    case = (1, 600, 600, 8, 2, 128, True, (-1, -1))
    q0, k0, v0, do = _inputs(case)
    grads = []
    for _ in range(2):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        attention(q, k, v, "softcap", softcap=50.0, evaluator="native", deterministic=True).backward(do)
        grads.append((q.grad, k.grad, v.grad))
    assert all(torch.equal(a, b) for a, b in zip(*grads))
