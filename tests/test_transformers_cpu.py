"""transformers integration on the CPU: registration, and a tiny random Gemma-2 through the
reference backend matching attn_implementation="eager" (both layer kinds exercised)."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

import flash_attn_poly.integrations.transformers as fap_hf  # noqa: E402


def _tiny_gemma2(attn):
    cfg = transformers.Gemma2Config(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=256, sliding_window=8,
        query_pre_attn_scalar=256, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
        max_position_embeddings=128)
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def test_register_and_match_eager_logits():
    name = fap_hf.register(backend="reference")
    eager, ours = _tiny_gemma2("eager"), _tiny_gemma2(name)
    ours.load_state_dict(eager.state_dict())
    assert ours.config._attn_implementation == name
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))  # 24 > window 8
    with torch.no_grad():
        ref = eager(ids).logits
        got = ours(ids).logits
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max() < 1e-4, (got - ref).abs().max()


def test_window_mapping_and_padding_fallback():
    assert fap_hf._window(None, 10) == (-1, -1)
    assert fap_hf._window(4096, 100) == (-1, -1)  # window longer than the sequence: plain causal
    assert fap_hf._window(8, 24) == (7, 0)
    name = fap_hf.register(backend="reference")
    model = _tiny_gemma2(name)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    pad = torch.ones(2, 12, dtype=torch.long)
    pad[1, :3] = 0
    with pytest.warns(UserWarning, match="padding"):
        fap_hf._warned.clear()
        with torch.no_grad():
            out = model(ids, attention_mask=pad).logits
    assert torch.isfinite(out[0]).all()
