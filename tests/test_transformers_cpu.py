"""transformers integration on the CPU: registration, and a tiny random Gemma-2 through the
reference backend matching attn_implementation="eager" (both layer kinds exercised)."""
import warnings

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


def test_window_mapping_and_4d_mask_fallback():
    assert fap_hf._window(None, 10) == (-1, -1)
    assert fap_hf._window(4096, 100) == (-1, -1)  # window longer than the sequence: plain causal
    assert fap_hf._window(8, 24) == (7, 0)
    q = torch.randn(1, 2, 6, 64)
    mask4d = torch.ones(1, 1, 6, 6, dtype=torch.bool)
    assert "4-D" in fap_hf._fallback_reason(None, q, q, q, mask4d, 0.0, (-1, -1), "reference")
    assert fap_hf._fallback_reason(None, q, q, q, mask4d[0, 0], 0.0, (-1, -1), "reference") is None


def _loss_and_grads(model, ids, **kw):
    """Logits, and the parameter gradients of the next-token loss over real (token, next token) pairs."""
    model.zero_grad()
    logits = model(ids, use_cache=False, **kw).logits   # no cache: eager masks packed sequences apart
    real = kw["attention_mask"].bool() if "attention_mask" in kw else torch.ones_like(ids, dtype=torch.bool)
    keep = real[:, :-1] & real[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1][keep], ids[:, 1:][keep])
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _eager_and_ours():
    name = fap_hf.register(backend="reference")
    eager, ours = _tiny_gemma2("eager"), _tiny_gemma2(name)
    ours.load_state_dict(eager.state_dict())
    return eager.train(), ours.train()   # dropout is 0: train() only turns on the gradient paths


def _assert_same(got, ref, keep=None):
    (gl, gg), (rl, rg) = got, ref
    if keep is not None:
        gl, rl = gl[keep], rl[keep]
    assert torch.isfinite(gl).all()
    assert (gl - rl).abs().max() < 1e-4, (gl - rl).abs().max()
    assert gg.keys() == rg.keys()
    for n in rg:
        scale = rg[n].abs().max().clamp_min(1e-6)
        assert ((gg[n] - rg[n]).abs().max() / scale) < 1e-4, n


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_runs_varlen_and_matches_eager(side, recwarn):
    """A padded batch (2-D mask; 24 tokens > window 8: both layer kinds) runs unpad -> varlen
    -> pad with no fallback; real tokens' logits and one step's gradients match eager."""
    eager, ours = _eager_and_ours()
    ids = torch.randint(0, 97, (3, 24), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(3, 24, dtype=torch.long)
    for row, n in ((1, 5), (2, 17)):
        if side == "left":
            mask[row, :n] = 0
        else:
            mask[row, 24 - n:] = 0
    fap_hf._warned.clear()
    got = _loss_and_grads(ours, ids, attention_mask=mask)
    assert not [w for w in recwarn if "falling back" in str(w.message)]
    _assert_same(got, _loss_and_grads(eager, ids, attention_mask=mask), keep=mask.bool())


def test_packed_batch_matches_eager_and_separate_sequences(recwarn):
    """A packed row (position_ids restart at each sequence, as padding-free collators hand
    them; and the same batch through the cu_seq_lens kwargs) matches eager, which masks the
    sequences apart; sequence 1 alone gives its logits."""
    eager, ours = _eager_and_ours()
    lens = [5, 11, 8]
    ids = torch.randint(0, 97, (1, sum(lens)), generator=torch.Generator().manual_seed(4))
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    fap_hf._warned.clear()
    got = _loss_and_grads(ours, ids, position_ids=pos)
    assert not [w for w in recwarn if "falling back" in str(w.message)]
    _assert_same(got, _loss_and_grads(eager, ids, position_ids=pos))
    cu = torch.tensor([0, 5, 16, 24], dtype=torch.int32)
    by_cu = _loss_and_grads(ours, ids, position_ids=pos, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                            max_length_q=11, max_length_k=11)
    _assert_same(by_cu, got)
    with torch.no_grad():
        alone = ours(ids[:, 5:16]).logits
    assert (alone - got[0][:, 5:16]).abs().max() < 1e-4


def test_plain_position_ids_take_the_dense_call(monkeypatch):
    """Position ids that never restart: the dense attention(), and the ids are read once per
    forward (not once per layer)."""
    name = fap_hf.register(backend="reference")
    model = _tiny_gemma2(name)
    calls = []
    import flash_attn_poly.varlen as fv
    monkeypatch.setattr(fv, "attention_varlen", lambda *a, **k: calls.append(a) or pytest.fail("varlen called"))
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(5))
    nz = []
    orig = torch.Tensor.nonzero
    monkeypatch.setattr(torch.Tensor, "nonzero", lambda self, *a, **k: nz.append(1) or orig(self, *a, **k))
    with torch.no_grad():
        model(ids, position_ids=torch.arange(12)[None])
    assert not calls and len(nz) == 1   # 2 layers, one read of the ids


def test_gpu_ragged_check_dry_run():
    """tests/test_transformers_gpu.py's ragged-batch check, its body on the CPU through the
    reference backend (only the CUDA launches are new on the device)."""
    import os
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from test_transformers_gpu import ragged_check
    res = ragged_check("cpu", "reference")
    assert set(res) == {"padded", "packed"}


def test_compiled_layers_read_position_ids_inside_one_op():
    """Under torch.compile (per decoder layer, as training scripts compile) the position ids go
    into one custom op that decides dense or varlen when it runs: a layer is one graph with no
    break (the data-dependent reading had split it into several), the ids are read once per
    forward, and plain, packed (one row) and packed (two rows) batches match eager, gradients too."""
    eager, ours = _eager_and_ours()
    layer = ours.model.layers[0]
    seen = {}
    orig = layer.forward
    layer.forward = lambda *a, **kw: seen.update(a=a, kw=kw) or orig(*a, **kw)
    ours(torch.randint(0, 97, (2, 24)), use_cache=False)
    layer.forward = orig
    assert "position_ids" in seen["kw"]   # transformers hands every layer the ids
    ex = torch._dynamo.explain(layer)(*seen["a"], **seen["kw"])
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), [str(r.reason)[:120] for r in ex.break_reasons]
    torch._dynamo.reset()
    for m in ours.model.layers:
        m.compile(backend="inductor")
    g = torch.Generator().manual_seed(6)
    two = torch.cat([torch.arange(10), torch.arange(14)])[None].expand(2, -1)
    cases = (({}, (2, 24)), ({"position_ids": torch.cat([torch.arange(n) for n in (5, 11, 8)])[None]}, (1, 24)),
             ({"position_ids": two}, (2, 24)))
    for kw, shape in cases:
        ids = torch.randint(0, 97, shape, generator=g)
        _assert_same(_loss_and_grads(ours, ids, **kw), _loss_and_grads(eager, ids, **kw))
    nz, orig_nz = [], torch.Tensor.nonzero
    torch.Tensor.nonzero = lambda self, *a, **k: nz.append(1) or orig_nz(self, *a, **k)
    try:
        _loss_and_grads(ours, ids, position_ids=two.clone())
    finally:
        torch.Tensor.nonzero = orig_nz
    assert len(nz) == 1, len(nz)   # 2 layers, forward and backward: one read
    torch._dynamo.reset()


# ------------------------------------------------------------------ the attention function's inputs
class _Mod(torch.nn.Module):
    def __init__(self, causal=True, training=False):
        super().__init__()
        self.is_causal = causal
        self.train(training)


def _bhsd(b=2, s=8, hq=4, hkv=2, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, hq, s, d, generator=g), torch.randn(b, hkv, s, d, generator=g),
            torch.randn(b, hkv, s, d, generator=g))


def _ref(q, k, v, **kw):   # (B, H, S, D) in, (B, S, H, D) out, FP64 reference
    from flash_attn_poly import reference as R
    out, _ = R.attention_ref(*(t.transpose(1, 2).double() for t in (q, k, v)), "softmax", **kw)
    return out.float()


FWD = fap_hf.make_attention_forward("poly", "reference")


@pytest.mark.parametrize("how", ["module", "kwarg"])
@pytest.mark.parametrize("path", ["kernels", "fallback"])
def test_non_causal_modules_are_not_masked_causally(how, path):
    """A module with is_causal False (or the is_causal kwarg that sdpa and flash honour) is
    bidirectional on both paths, its sliding window |i - j| < w both ways; the fallback (a 4-D
    all-ones mask here) used to mask it causally."""
    q, k, v = _bhsd()
    mod = _Mod(causal=how != "module")
    kw = {"is_causal": False} if how == "kwarg" else {}
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool) if path == "fallback" else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = FWD(mod, q, k, v, mask, sliding_window=3, **kw)
    want = _ref(q, k, v, causal=False, window_size=(2, 2))
    assert (out - want).abs().max() < 1e-4, (out - want).abs().max()


def test_dropout_fallback_keeps_packed_sequences_apart():
    """Attention dropout in training falls back to torch; a packed row (position ids restarting)
    still attends within its sequences (it attended across them)."""
    q, k, v = _bhsd(b=1, s=6)
    pos = torch.tensor([[0, 1, 2, 0, 1, 2]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = FWD(_Mod(training=True), q, k, v, None, dropout=1e-9, position_ids=pos)
    want = torch.cat([_ref(q[:, :, :3], k[:, :, :3], v[:, :, :3], causal=True),
                      _ref(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], causal=True)], dim=1)
    assert (out - want).abs().max() < 1e-4, (out - want).abs().max()


@pytest.mark.parametrize("cu_q,cu_k,mx,match", [
    ([0, 3, 5], [0, 3, 5], 3, r"cu_seqlens_q\[-1\] = 5 must equal"),
    ([0, 4, 2, 6], [0, 4, 2, 6], 4, "must be non-decreasing"),
    ([0, 3, 6], [0, 3, 6], 2, "smaller than sequence 0's length 3"),
    ([0, 2, 6], [0, 3, 6], 4, "cu_seq_lens_q and cu_seq_lens_k differ"),
    ([0, 2, 8, 12], [0, 2, 8, 12], 6, "a sequence across batch rows 0 and 1"),   # b = 2 rows of 6
])
def test_dropout_fallback_checks_given_offsets(cu_q, cu_k, mx, match):
    """The dropout fallback reads cu_seq_lens handed in as kwargs: bad values are refused by
    name as attention_varlen refuses them (it built segment ids from them silently)."""
    q, k, v = _bhsd(b=max(1, cu_q[-1] // 6), s=6)
    kw = dict(cu_seq_lens_q=torch.tensor(cu_q, dtype=torch.int32), cu_seq_lens_k=torch.tensor(cu_k, dtype=torch.int32),
              max_length_q=mx, max_length_k=mx)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=match):
            FWD(_Mod(training=True), q, k, v, None, dropout=1e-9, **kw)
    q, k, v = q[:1], k[:1], v[:1]
    for cu in ([0, 3, 6], [0, 3, 6, 6], [0, 0, 3, 6]):   # empty sequences too, first and last
        good = dict(cu_seq_lens_q=torch.tensor(cu, dtype=torch.int32), cu_seq_lens_k=torch.tensor(cu, dtype=torch.int32),
                    max_length_q=3, max_length_k=3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, _ = FWD(_Mod(training=True), q, k, v, None, dropout=1e-9, **good)
        want = torch.cat([_ref(q[:, :, :3], k[:, :, :3], v[:, :, :3], causal=True),
                          _ref(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], causal=True)], dim=1)
        assert (out - want).abs().max() < 1e-4, cu


def test_dropout_fallback_checks_the_same_offsets_once(monkeypatch):
    """The dropout fallback's offset check (a copy to the host) runs once for the same offsets
    tensors, as the kernel path's: a layer per call would sync every layer of a step; an in-place
    write checks again."""
    from flash_attn_poly.integrations import transformers as T
    from flash_attn_poly import varlen as fv
    monkeypatch.setattr(fv, "_CHECKED", type(fv._CHECKED)())
    calls = []
    real = T._check_fallback_offsets
    monkeypatch.setattr(T, "_check_fallback_offsets", lambda *a: calls.append(1) or real(*a))
    q, k, v = _bhsd(b=1, s=6)
    cu = torch.tensor([0, 3, 6], dtype=torch.int32)
    kw = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=3, max_length_k=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            FWD(_Mod(training=True), q, k, v, None, dropout=1e-9, **kw)
        assert len(calls) == 1
        cu.add_(0)
        FWD(_Mod(training=True), q, k, v, None, dropout=1e-9, **kw)
    assert len(calls) == 2


@pytest.mark.parametrize("path", ["kernels", "fallback"])
def test_keys_beyond_a_narrower_padding_mask_are_dropped(path):
    """A static cache hands more key slots than the 2-D mask covers: the slots past the mask are
    not attended (as transformers' _upad_input slices them); a float 1/0 mask is a padding mask."""
    q, k, v = _bhsd(s=6)
    kl, vl = torch.randn(2, 2, 10, 32), torch.randn(2, 2, 10, 32)
    kl[:, :, :6], vl[:, :, :6] = k, v
    mask = torch.ones(2, 6) if path == "fallback" else torch.ones(2, 6, dtype=torch.long)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _ = FWD(_Mod(training=path == "fallback"), q, kl, vl, mask, dropout=1e-9 if path == "fallback" else 0.0)
    assert (out - _ref(q, k, v, causal=True)).abs().max() < 1e-4


@pytest.mark.parametrize("call,err,match", [
    (dict(attention_mask=torch.ones(1, 8, dtype=torch.long)), ValueError, "attention_mask: a 2-D padding mask"),
    (dict(attention_mask=torch.ones(3, 8, dtype=torch.long)), ValueError, "attention_mask: a 2-D padding mask"),
    (dict(attention_mask=torch.ones(2, 8, 8, dtype=torch.bool)), ValueError, "attention_mask must be 2-D"),
    (dict(attention_mask=torch.ones(8, dtype=torch.bool)), ValueError, "attention_mask must be 2-D"),
    (dict(attention_mask=torch.ones(3, 1, 8, 8, dtype=torch.bool)), ValueError, "attention_mask: a 4-D mask"),
    (dict(s_aux=torch.zeros(4)), ValueError, "s_aux"),
    (dict(dropout="0.1"), ValueError, "dropout must be a number"),
    (dict(dropout=1.5), ValueError, "dropout must be a number"),
    (dict(sliding_window=2.5), TypeError, "sliding_window must be an int"),
    (dict(sliding_window="4"), TypeError, "sliding_window must be an int"),
    (dict(sliding_window=-5), ValueError, "sliding_window must be >= 0"),
    (dict(cu_seq_lens_q=[0, 3, 16], cu_seq_lens_k=[0, 3, 16], max_length_q=13, max_length_k=13), TypeError,
     "cu_seq_lens_q must be a torch.Tensor"),
    (dict(cu_seq_lens_q=torch.tensor([0, 3, 16]), cu_seq_lens_k=torch.tensor([0, 3, 16], dtype=torch.int32),
          max_length_q=13, max_length_k=13), TypeError, r"cu_seq_lens_q must have dtype torch.int32.*int64"),
    (dict(cu_seq_lens_q=torch.tensor([0, 3, 16], dtype=torch.int32), cu_seq_lens_k=torch.tensor([0., 3, 16]),
          max_length_q=13, max_length_k=13), TypeError, r"cu_seq_lens_k must have dtype torch.int32.*float32"),
    (dict(position_ids=torch.zeros(3, 8, dtype=torch.long)), ValueError, "position_ids must be"),
])
def test_bad_inputs_name_themselves(call, err, match):
    q, k, v = _bhsd()
    call = dict(call)
    mask = call.pop("attention_mask", None)
    with pytest.raises(err, match=match):
        FWD(_Mod(), q, k, v, mask, **call)


def test_given_offsets_are_checked_and_output_attentions_warns():
    """cu_seq_lens handed in as kwargs are checked (cached per tensor: once per forward); asking
    for attention weights warns that none come back."""
    q, k, v = _bhsd(b=1, s=6)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)   # 5 tokens of 6
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[-1\] = 5 must equal"):
        FWD(_Mod(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=3, max_length_k=3)
    fap_hf._warned.discard("output_attentions: poly_attention returns no attention weights (None)")
    with pytest.warns(UserWarning, match="returns no attention weights"):
        out, w = FWD(_Mod(), q, k, v, None, output_attentions=True)
    assert w is None


def test_register_refuses_what_cannot_run():
    with pytest.raises(ValueError, match="evaluator must be one of"):
        fap_hf.register(evaluator="bogus")
    with pytest.raises(ValueError, match="backend must be one of"):
        fap_hf.register(backend="gpu")
    with pytest.raises(ValueError, match="name must be a non-empty str without 'flash'"):
        fap_hf.register(name="flash_poly")
