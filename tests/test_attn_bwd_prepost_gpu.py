"""GPU tier: the CuTe pre/post kernels (kernels/attn_bwd_prepost_sm90.py, launched by
kernels/prepost_launch.py) against the torch reference (kernels/attn_bwd_prepost.py).

post: bit-identical (both form acc * fl32(scale) in FP32 and round once to nearest even).
lse2: bit-identical (one FP32 multiply by fl32(log2 e), -inf -> +inf, +inf padding).
dsum: the products dO * O of 16-bit values are exact in FP32, so the two results are two
    summation orders of the same D numbers.  Any order of n - 1 FP32 additions is within
    (n - 1) u sum|p_i| of the exact sum (u = 2**-24, first-order bound), so the two differ
    by at most 2 (D - 1) u sum|p_i|; sum|p_i| is taken in FP64 from the inputs.
end to end: the backward of a plan (kernels/dispatch.backward) with its CuTe pre/post vs the
    same call with the torch reference's preprocess / postprocess / postprocess_dq swapped in
    (monkeypatched into kernels/prepost_launch.py), norm-relative < 1e-3 and the worst element
    within one 16-bit rounding step of the largest (see the test).
"""
import math

import pytest

torch = pytest.importorskip("torch")

from flash_attn_poly.kernels import attn_bwd_prepost as ref  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16]


def _cute():
    """The CuTe kernels' launch path (same contract as the torch reference module)."""
    from flash_attn_poly.kernels import prepost_launch
    return prepost_launch


def _inputs(b, s, h, d, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    do = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    o = torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    lse = torch.randn(b, h, s, device="cuda", generator=g) * 4 + 8
    lse[:, :, ::7] = -math.inf          # rows that saw no key
    lse[:, 0, 1:2] = math.inf
    return do, o, lse


PRE_CASES = [  # (B, S, H, D): odd S, S not a multiple of the pad 128, exact multiples
    (1, 1, 1, 64), (1, 77, 3, 64), (2, 333, 4, 128), (1, 128, 2, 128), (2, 257, 8, 64),
    (1, 4096, 32, 128), (1, 129, 2, 256),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", PRE_CASES, ids=str)
@pytest.mark.parametrize("base", ["e", "2"])
def test_pre_matches_torch(case, dtype, base):
    b, s, h, d = case
    do, o, lse = _inputs(b, s, h, d, dtype, seed=s)
    l_ref, d_ref = ref.preprocess(do, o, lse, True, True, base, 128)
    l_cu, d_cu = _cute().preprocess(do, o, lse, True, True, base, 128)
    torch.cuda.synchronize()
    assert l_cu.shape == l_ref.shape == d_cu.shape
    assert torch.equal(l_cu, l_ref)                              # incl. +inf rows and padding
    assert torch.equal(d_cu[:, :, s:], torch.zeros_like(d_cu[:, :, s:]))
    _assert_dsum_close(d_cu, d_ref, do, o)


def _assert_dsum_close(d_cu, d_ref, do, o):
    """Two summation orders of the same exact products: within 2 (D - 1) u sum|p_i|."""
    s, d = do.shape[1], do.shape[3]
    abs_sum = (do.double() * o.double()).abs().sum(-1).transpose(1, 2)   # (B, H, S)
    bound = 2 * (d - 1) * 2.0 ** -24 * abs_sum
    err = (d_cu[:, :, :s].double() - d_ref[:, :, :s].double()).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound.clamp_min(1e-300)).max().item():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("needs_lse,needs_dsum", [(False, False), (True, False), (False, True)])
def test_pre_stage_flags(needs_lse, needs_dsum):
    """An unneeded buffer is all zeros when the other one is computed; with neither needed
    (sigmoid) the placeholder is left uninitialised (the backward loads it, then ignores it):
    only its shape and dtype are promised."""
    b, s, h, d = 1, 201, 4, 128
    do, o, lse = _inputs(b, s, h, d, torch.bfloat16)
    l_ref, d_ref = ref.preprocess(do, o, lse if needs_lse else None, needs_lse, needs_dsum, "e", 128)
    l_cu, d_cu = _cute().preprocess(do, o, lse if needs_lse else None, needs_lse, needs_dsum, "e", 128)
    torch.cuda.synchronize()
    if not (needs_lse or needs_dsum):
        for t in (l_cu, d_cu):
            assert t.shape == l_ref.shape and t.dtype == torch.float32 and t.device == do.device
        return
    assert torch.equal(l_cu, l_ref)
    if needs_dsum:
        _assert_dsum_close(d_cu, d_ref, do, o)
        assert torch.equal(d_cu[:, :, s:], d_ref[:, :, s:])     # zero padding
    else:
        assert torch.equal(d_cu, d_ref)          # zeros


POST_CASES = [  # (B, S_q, S_k, H_q, H_kv, D)
    (1, 1, 1, 1, 1, 64), (1, 77, 131, 4, 2, 64), (2, 333, 333, 8, 2, 128), (1, 4096, 4096, 32, 8, 128),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", POST_CASES, ids=str)
@pytest.mark.parametrize("n_counters", [0, 37])
def test_post_bit_identical(case, dtype, n_counters):
    b, sq, sk, hq, hkv, d = case
    q = torch.empty(b, sq, hq, d, device="cuda", dtype=dtype)
    k = torch.empty(b, sk, hkv, d, device="cuda", dtype=dtype)
    accs = ref.accumulators(q, k, n_counters)
    g = torch.Generator(device="cuda").manual_seed(sq)
    for a in accs[:3]:     # wide exponent range: rounding ties, FP16 overflow, tiny values
        a.copy_(torch.randn(a.shape, device="cuda", generator=g)
                * torch.exp2(torch.randint(-30, 20, a.shape, device="cuda", generator=g).float()))
    accs[0][0, 0, 0, :4] = torch.tensor([0.0, -0.0, 1e-40, 3e38], device="cuda")
    s_pad = accs[0].shape[2]               # the dQ accumulator's padding rows: never read
    pad = _cute().dq_acc_index(s_pad, d).to("cuda")[sq:].reshape(-1)
    accs[0].view(b, hq, -1)[..., pad] = float("nan")
    scale = d ** -0.5
    want = ref.postprocess(*accs[:3], scale, dtype, sq)
    got = _cute().postprocess(*accs[:3], scale, dtype, sq)
    torch.cuda.synchronize()
    for w, gt in zip(want, got):
        assert gt.dtype == dtype and gt.shape == w.shape
        assert torch.equal(gt.view(torch.int16), w.view(torch.int16))   # bitwise, incl. -0, inf


E2E_CASES = [  # (B, S_q, S_k, H_q, H_kv, D, causal, mode)
    (2, 333, 333, 8, 2, 128, True, "softmax"),
    (1, 177, 301, 4, 4, 64, False, "softmax"),
    (1, 257, 257, 8, 8, 128, True, "softcap"),
    (1, 257, 257, 8, 2, 128, True, "sigmoid"),
    (1, 200, 200, 4, 2, 256, True, "softcap"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", E2E_CASES, ids=str)
def test_attn_bwd_cute_vs_torch_prepost(case, dtype, monkeypatch):
    from flash_attn_poly import testing
    b, sq, sk, hq, hkv, d, causal, mode = case
    g = torch.Generator(device="cuda").manual_seed(sq * 7 + d)
    mk = lambda s, h: torch.randn(b, s, h, d, device="cuda", dtype=dtype, generator=g)
    q, k, v, do, o = mk(sq, hq), mk(sk, hkv), mk(sk, hkv), mk(sq, hq), mk(sq, hq)
    lse = None if mode == "sigmoid" else torch.randn(b, hq, sq, device="cuda", generator=g) + 2 * math.log(sk)
    plan = testing.plan_for(q, k, v, mode, "native", causal=causal, softcap=50.0 if mode == "softcap" else None)
    grads = {"cute": testing.run_backward(plan, do, q, k, v, o, lse)}
    launch = _cute()
    for name in ("preprocess", "postprocess", "postprocess_dq", "postprocess_dkv"):   # what dispatch.backward calls
        monkeypatch.setattr(launch, name, getattr(ref, name))
    grads["torch"] = testing.run_backward(plan, do, q, k, v, o, lse)
    torch.cuda.synchronize()
    for a, r in zip(grads["cute"], grads["torch"]):
        a, r = a.double(), r.double()
        # dsum's summation order and the atomics' order perturb the FP32 accumulators at the
        # FP32 rounding level, which can flip single 16-bit roundings (up to 2**-7 relative
        # to the element): judge the norm at 1e-3 and the worst element at one rounding step.
        rel = ((a - r).norm() / r.norm()).item()
        worst = ((a - r).abs().max() / r.abs().max()).item()
        assert torch.isfinite(a).all() and rel < 1e-3 and worst <= 2.0 ** -7, (rel, worst)


ZERO_DQ_CASES = [(1, 1, 1, 64), (2, 333, 4, 128), (1, 4096, 32, 128), (1, 129, 2, 256)]


@pytest.mark.gpu
@pytest.mark.parametrize("flags", [(True, True), (False, True), (False, False)], ids=str)
@pytest.mark.parametrize("case", ZERO_DQ_CASES, ids=str)
def test_pre_zero_dq(case, flags):
    """PreZeroKernel: a NaN-poisoned dQ accumulator comes back all zeros, and lse2 / dsum are
    bit-identical to the pre kernel without zeroing (same rows code)."""
    b, s, h, d = case
    needs_lse, needs_dsum = flags
    do, o, lse = _inputs(b, s, h, d, torch.bfloat16, seed=s + 1)
    lse = lse if needs_lse else None
    dq_acc = torch.full(_cute().dq_acc_shape(b, s, h, d), float("nan"), device="cuda")
    l0, d0 = _cute().preprocess(do, o, lse, needs_lse, needs_dsum, "e", 128)
    l1, d1 = _cute().preprocess(do, o, lse, needs_lse, needs_dsum, "e", 128, dq_acc=dq_acc)
    torch.cuda.synchronize()
    # every row (the padding rows take the main kernel's zero adds), the D columns (the row
    # padding is never read, and the staged tile's padding words land there)
    assert torch.equal(dq_acc[..., :d], torch.zeros_like(dq_acc[..., :d]))
    if not (needs_lse or needs_dsum):   # without zeroing that is an uninitialised placeholder
        assert not l1.any() and not d1.any()
        return
    assert torch.equal(l0, l1) and torch.equal(d0, d1)


ZERO_DQ_E2E = [  # (B, S_q, S_k, H_q, H_kv, D, causal, mode, evaluator)
    (1, 333, 333, 8, 2, 128, True, "softmax", "native"),
    (2, 257, 300, 4, 4, 64, False, "softcap", "poly"),
    (1, 257, 257, 8, 2, 128, True, "sigmoid", "poly"),
    (1, 200, 200, 4, 2, 256, True, "softcap", "native"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ZERO_DQ_E2E, ids=str)
def test_attn_bwd_zero_dq_in_pre(case):
    """head_loop backward with the dQ accumulator zeroed by the pre kernel vs by a memset:
    the same sums up to the order of the FP32 dQ atomics, which can flip BF16 roundings of dQ
    (one ulp = 2^-8 relative; a 1/16 of elements flipped is rel L2 ~1e-3): bound 2e-3, far
    below what a missed or doubled zeroing gives (NaN from the poisoned pool, or O(1))."""
    from flash_attn_poly import testing
    b, sq, sk, hq, hkv, d, causal, mode, ev = case
    g = torch.Generator(device="cuda").manual_seed(sq + d)
    mk = lambda s, h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    q, k, v, do, o = mk(sq, hq), mk(sk, hkv), mk(sk, hkv), mk(sq, hq), mk(sq, hq)
    lse = None if mode == "sigmoid" else torch.randn(b, hq, sq, device="cuda", generator=g) + 2 * math.log(sk)
    kw = dict(causal=causal, softcap=50.0 if mode == "softcap" else None)
    by_memset = testing.plan_for(q, k, v, mode, ev, {"bwd.head_loop": True, "bwd.zero_dq_in_pre": False}, **kw)
    by_pre = testing.plan_for(q, k, v, mode, ev, {"bwd.head_loop": True, "bwd.zero_dq_in_pre": True}, **kw)
    assert by_pre.zero_dq_in_pre and not by_memset.zero_dq_in_pre
    # a poisoned pool: the accumulator torch.empty returns may hold NaNs unless zeroed
    torch.full((b, sq, hq, d), float("nan"), device="cuda")
    ref = testing.run_backward(by_memset, do, q, k, v, o, lse)
    got = testing.run_backward(by_pre, do, q, k, v, o, lse)
    torch.cuda.synchronize()
    from flash_attn_poly.testing import rel_l2_err
    for name, a, r in zip(("dq", "dk", "dv"), got, ref):
        assert torch.isfinite(a).all(), name
        assert rel_l2_err(a, r) < 2e-3, (name, rel_l2_err(a, r))


VARLEN_POST_CASES = [  # (sequence lengths, H, D)
    ([5, 0, 130, 1], 4, 64), ([300, 77], 32, 128), ([1], 2, 256), ([129, 128, 127], 8, 64),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", VARLEN_POST_CASES, ids=str)
def test_post_dq_varlen_bit_identical(case, dtype):
    """PostDqVarlenKernel vs the torch reference: each sequence's rows from its padded offset
    (everything else NaN: padding rows, row padding and the gaps between sequences' blocks)."""
    lengths, h, d = case
    cu_l = [0]
    for n in lengths:
        cu_l.append(cu_l[-1] + n)
    launch = _cute()
    rows = launch.varlen_padded_rows(cu_l[-1], len(lengths))
    g = torch.Generator(device="cuda").manual_seed(rows + d)
    acc = torch.full((1, h, rows, d), float("nan"), device="cuda")
    idx = launch.dq_acc_index(-(-max(lengths) // 16) * 16, d).to("cuda")
    for b, n in enumerate(lengths):
        p = launch.varlen_padded_offset(cu_l[b], b)   # a multiple of the 16-row band
        vals = torch.randn(h, n * d, device="cuda", generator=g) * 1e3
        acc.view(h, -1)[:, p * d + idx[:n].reshape(-1)] = vals
    cu = torch.tensor(cu_l, dtype=torch.int32, device="cuda")
    want = ref.postprocess_dq_varlen(acc, 0.125, dtype, cu_l)
    got = launch.postprocess_dq_varlen(acc, 0.125, dtype, cu, max(lengths), cu_l[-1])
    torch.cuda.synchronize()
    assert got.shape == want.shape == (cu_l[-1], h, d)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
