"""GPU tier (issue 6): a tiny random Gemma-2 through our kernels vs transformers' eager path.

Both layer kinds run (sequence 200 > sliding window 64). Reference: eager in FP32; the
BF16 eager run measures what BF16 costs, and ours (BF16 autocast) must stay within 2x that
error + a floor (the tolerance rule of flash_attn_poly.testing, in rel L2 of the logits and
of one training step's parameter gradients).  head_dim 128 and Gemma-2's own head_dim 256
run forward and backward on the kernels (no fallback warning may appear).
Run on the H200: python -m pytest -q -m gpu tests/test_transformers_gpu.py"""
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.gpu

import flash_attn_poly.integrations.transformers as fap_hf  # noqa: E402


def _gemma2(attn, head_dim):
    cfg = transformers.Gemma2Config(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, sliding_window=64,
        query_pre_attn_scalar=head_dim, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        max_position_embeddings=512)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).cuda()


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _run(model, ids, bf16, grad):
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16), torch.set_grad_enabled(grad):
        logits = model(ids).logits.float()
    if not grad:
        return logits, None
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return logits.detach(), torch.cat([g.flatten().float() for g in grads])


def _models(evaluator, head_dim):
    name = fap_hf.register(evaluator=evaluator, backend="cuda")
    eager, ours = _gemma2("eager", head_dim), _gemma2(name, head_dim)
    ours.load_state_dict(eager.state_dict())
    return eager, ours


@pytest.mark.parametrize("head_dim", [128, 256])
@pytest.mark.parametrize("evaluator", ["native", "poly"])
def test_gemma2_logits_and_gradients_match_eager(evaluator, head_dim):
    eager, ours = _models(evaluator, head_dim)
    ids = torch.randint(0, 256, (2, 200), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    ref_l, ref_g = _run(eager, ids, bf16=False, grad=True)    # FP32 eager: the reference
    low_l, low_g = _run(eager, ids, bf16=True, grad=True)     # BF16 eager: what BF16 costs
    fap_hf._warned.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got_l, got_g = _run(ours, ids, bf16=True, grad=True)
    fallbacks = [str(w.message) for w in seen if "falling back" in str(w.message)]
    assert not fallbacks, fallbacks                           # every layer ran on our kernels
    assert torch.isfinite(got_l).all() and torch.isfinite(got_g).all()
    assert _rel(got_l, ref_l) <= 2 * _rel(low_l, ref_l) + 2e-3, (_rel(got_l, ref_l), _rel(low_l, ref_l))
    assert _rel(got_g, ref_g) <= 2 * _rel(low_g, ref_g) + 1e-2, (_rel(got_g, ref_g), _rel(low_g, ref_g))


# ---------------------------------------------------------------------- ragged batches (issue 28)
def _gemma2_on(attn, head_dim, device):
    cfg = transformers.Gemma2Config(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, sliding_window=64,
        query_pre_attn_scalar=head_dim, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        max_position_embeddings=512)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).to(device)


def _run_ragged(model, ids, bf16, device, **kw):
    """Logits of the real tokens and the parameter gradients of the next-token loss over real
    (token, next token) pairs; no cache (eager then masks packed sequences apart)."""
    with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
        logits = model(ids, use_cache=False, **kw).logits.float()
    real = kw["attention_mask"].bool() if "attention_mask" in kw else torch.ones_like(ids, dtype=torch.bool)
    keep = real[:, :-1] & real[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1][keep], ids[:, 1:][keep])
    grads = torch.autograd.grad(loss, list(model.parameters()), allow_unused=True)
    return logits[real].detach(), torch.cat([g.flatten().float() for g in grads if g is not None])


def ragged_check(device, backend, evaluator="poly", head_dim=128):
    """A left-padded batch and a packed row (position_ids restart; lengths around the sliding
    window 64) through our attention vs eager: FP32 eager is the reference, BF16 eager what
    BF16 costs; ours (BF16 autocast) within 2x that + a floor, logits and gradients, with no
    fallback warning."""
    name = fap_hf.register(evaluator=evaluator, backend=backend)
    eager, ours = _gemma2_on("eager", head_dim, device), _gemma2_on(name, head_dim, device)
    ours.load_state_dict(eager.state_dict())
    g = torch.Generator(device).manual_seed(7)
    ids = torch.randint(0, 256, (3, 150), device=device, generator=g)
    mask = torch.ones(3, 150, dtype=torch.long, device=device)
    mask[1, :90] = 0          # left padding: 60 tokens (inside the window)
    mask[2, :1] = 0           # 149 tokens (beyond it)
    lens = [1, 70, 0, 33, 46]   # a packed row (the empty entry adds nothing)
    pos = torch.cat([torch.arange(n) for n in lens])[None].to(device)
    ids_p = torch.randint(0, 256, (1, sum(lens)), device=device, generator=g)
    results = {}
    for label, inputs, kw in (("padded", ids, {"attention_mask": mask}), ("packed", ids_p, {"position_ids": pos})):
        ref_l, ref_g = _run_ragged(eager, inputs, False, device, **kw)
        low_l, low_g = _run_ragged(eager, inputs, True, device, **kw)
        fap_hf._warned.clear()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got_l, got_g = _run_ragged(ours, inputs, True, device, **kw)
        fallbacks = [str(w.message) for w in seen if "falling back" in str(w.message)]
        assert not fallbacks, (label, fallbacks)
        assert torch.isfinite(got_l).all() and torch.isfinite(got_g).all(), label
        assert _rel(got_l, ref_l) <= 2 * _rel(low_l, ref_l) + 2e-3, (label, _rel(got_l, ref_l), _rel(low_l, ref_l))
        assert _rel(got_g, ref_g) <= 2 * _rel(low_g, ref_g) + 1e-2, (label, _rel(got_g, ref_g), _rel(low_g, ref_g))
        results[label] = (_rel(got_l, ref_l), _rel(low_l, ref_l), _rel(got_g, ref_g), _rel(low_g, ref_g))
    return results


def test_gemma2_padded_and_packed_batches_match_eager():
    ragged_check("cuda", "cuda")


def test_compiled_layers_with_position_ids_match_eager():
    """Decoder layers compiled as training scripts compile them: the position ids go into one
    custom op (a layer is one graph), and plain (B = 2) and packed (B = 1, restarting ids) batches
    stay within the rule of the FP32 eager reference, logits and gradients."""
    name = fap_hf.register(evaluator="poly", backend="cuda")
    eager, ours = _gemma2_on("eager", 128, "cuda"), _gemma2_on(name, 128, "cuda")
    ours.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    for layer in ours.model.layers:
        layer.compile()
    g = torch.Generator("cuda").manual_seed(9)
    lens = [40, 90, 70]
    packed = torch.cat([torch.arange(n) for n in lens])[None].cuda()
    for label, ids, kw in (("plain", torch.randint(0, 256, (2, 200), device="cuda", generator=g), {}),
                           ("packed", torch.randint(0, 256, (1, sum(lens)), device="cuda", generator=g),
                            {"position_ids": packed})):
        ref_l, ref_g = _run_ragged(eager, ids, False, "cuda", **kw)
        low_l, low_g = _run_ragged(eager, ids, True, "cuda", **kw)
        got_l, got_g = _run_ragged(ours, ids, True, "cuda", **kw)
        assert torch.isfinite(got_l).all() and torch.isfinite(got_g).all(), label
        assert _rel(got_l, ref_l) <= 2 * _rel(low_l, ref_l) + 2e-3, (label, _rel(got_l, ref_l), _rel(low_l, ref_l))
        assert _rel(got_g, ref_g) <= 2 * _rel(low_g, ref_g) + 1e-2, (label, _rel(got_g, ref_g), _rel(low_g, ref_g))
    torch._dynamo.reset()
