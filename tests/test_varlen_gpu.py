"""attention_varlen by the FlashAttention rule (tests/rule_harness.py), fuzzed over random
length lists that include 0 and 1 (and S_q != S_k): forward O, LSE and dQ, dK, dV of the packed
batch against the FP64 reference of each sequence, with torch at the input precision as the
yardstick.  Few variants (few kernel builds): the GPU tier is cheap.

The same body runs on the CPU with backend="reference" (the non-gpu tests here), so only the
CUDA launches are new on the device.  Run on the H200:
    python -m pytest -q -p no:cacheprovider -m gpu tests/test_varlen_gpu.py
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import builds as B  # noqa: E402
import rule_harness as H  # noqa: E402

import flash_attn_poly as fap  # noqa: E402
import flash_attn_poly.varlen as fv  # noqa: E402
from flash_attn_poly import reference as R  # noqa: E402

FUZZ_SEED = 2812
# (mode, evaluator, dtype, head_dim, causal, window, softcap): variants of the correctness
# catalogue (tests/cases.py), so the kernels they resolve to are builds it has
VARIANTS = [
    ("softmax", "native", "bf16", 128, True, (-1, -1), None),
    ("softcap", "poly", "bf16", 256, True, (-1, -1), 30.0),
    ("softmax", "native", "bf16", 128, False, (48, 16), None),
    ("sigmoid", "poly", "fp16", 128, True, (-1, -1), None),
    ("softmax", "native", "bf16", 64, True, (-1, -1), None),   # the 192 x 128 forward tile
    # the softcap D = 128 forward's 192 x 64 tile in turns, packed and windowed (no O staging there)
    ("softcap", "poly", "bf16", 128, True, (-1, -1), 30.0),
    ("softcap", "native", "bf16", 128, True, (300, 0), 50.0),
]


def draw_lengths(rng, n_seq, causal):
    """A length list with 0s and 1s often, long-tailed otherwise; S_k = S_q or independent."""
    def one():
        u = rng.random()
        if u < 0.15:
            return 0
        if u < 0.3:
            return 1
        return int(min(700, rng.pareto(1.2) * 40 + 2))
    lens_q = [one() for _ in range(n_seq)]
    lens_k = list(lens_q) if rng.random() < 0.5 else [one() for _ in range(n_seq)]
    return lens_q, lens_k


def drawn_cases(variants, seed: int, count: int, fixed=(), prefix: str = "") -> list:
    """pytest params (variant, lens_q, lens_k, seed): the `fixed` params first, then `count` length
    draws per variant from numpy's Generator(seed), ids prefix + the variant + the lengths."""
    rng = np.random.default_rng(seed)
    out = list(fixed)
    for var in variants:
        for _ in range(count):
            lens_q, lens_k = draw_lengths(rng, int(rng.integers(1, 7)), var[4])
            out.append(pytest.param(var, lens_q, lens_k, int(rng.integers(1 << 30)),
                                    id=f"{prefix}{var[0]}-{var[1]}-{var[2]}-d{var[3]}-c{int(var[4])}-"
                                       f"w{var[5][0]}_{var[5][1]}-q{'_'.join(map(str, lens_q))}-"
                                       f"k{'_'.join(map(str, lens_k))}"))
    return out


def cases(count=3):
    return drawn_cases(VARIANTS, FUZZ_SEED, count)


def _cu(lens, device):
    return torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32, device=device)


KERNEL_SIGMOID_BIAS = -4.0   # the varlen kernel takes one bias (the default -ln S_k is per sequence)


def varlen_call_of(c, max_q: int, max_k: int):
    """The VarlenCall of a packed call's plan call c (flash_attn_poly.varlen: batch = sequences):
    what the kernel stand-ins hand the reference backend."""
    return fv.VarlenCall(mode=c.mode, evaluator=c.evaluator, dtype=c.dtype, head_dim=c.head_dim, batch=c.batch,
                         max_seqlen_q=max_q, max_seqlen_k=max_k, heads_q=c.heads_q, heads_kv=c.heads_kv,
                         causal=c.causal, window=c.window, softmax_scale=c.softmax_scale, softcap=c.softcap,
                         sigmoid_bias=c.sigmoid_bias)


def run_and_judge(var, lens_q, lens_k, seed, backend, device, kernel=False, kernel_bwd=False, compact=False,
                  head_loop=False, dq_halves=False, bwd_extra=None, fwd_extra=None):
    """{tensor name: judge record} of one packed batch.  kernel: the forward only, through the
    varlen forward kernel (plan overrides fwd.varlen and fwd.varlen_compact = compact: the slot
    order or the compact one, whichever the plan would pick for these lengths; sigmoid with
    KERNEL_SIGMOID_BIAS); fwd_extra: more forward overrides.
    kernel_bwd: the per-sequence forward (the reference on the CPU), then the backward through
    the varlen backward kernels (plan override bwd.varlen, bwd.head_loop = head_loop: the
    per-KV-head loop, and bwd.dq_halves = dq_halves: the staged dQ tile by warpgroup halves;
    sigmoid with KERNEL_SIGMOID_BIAS); bwd_extra: more backward overrides; None at D = 256: the
    chunked build (tests/builds.CHUNKED_D256, which packed user-score calls take; the plan's packed
    D = 256 build for the built-in scores is the swapped one: SWAP_OVERRIDES)."""
    mode, evaluator, dtype, d, causal, window, cap = var
    dt = H.DTYPES[dtype]
    hq, hkv = 4, 2
    g = torch.Generator(device=device).manual_seed(seed)
    amp = cap / 4 if mode == "softcap" else 1.0
    tq, tk = sum(lens_q), sum(lens_k)
    mk = lambda n, h, a=1.0: (torch.randn(n, h, d, generator=g, device=device) * a).to(dt).requires_grad_()
    q, k, v = mk(tq, hq, amp), mk(tk, hkv), mk(tk, hkv)
    dout = torch.randn(tq, hq, d, generator=g, device=device).to(dt)
    cu_q, cu_k = _cu(lens_q, device), _cu(lens_k, device)
    kw = dict(causal=causal, window_size=window, softcap=cap)
    if kernel or kernel_bwd:
        if mode == "sigmoid":
            kw["sigmoid_bias"] = KERNEL_SIGMOID_BIAS
        call = fv.validate(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), mode, evaluator, causal, cap,
                           kw.get("sigmoid_bias"), None, window)
    if kernel_bwd:
        with torch.no_grad():
            qd, kd, vd = (t.detach() for t in (q, k, v))
            out, lse = fv._forward(qd, kd, vd, cu_q, cu_k, call, True, backend if device == "cuda" else "reference")
            grads = fv._backward(dout, qd, kd, vd, cu_q, cu_k, out, lse, call, backend,
                                 overrides={"bwd.varlen": True, "bwd.head_loop": head_loop,
                                            "bwd.dq_halves": dq_halves,
                                            **(B.CHUNKED_D256 if bwd_extra is None and d == 256 else bwd_extra or {})})
        if mode == "sigmoid":
            lse = None
    elif kernel:
        with torch.no_grad():
            # both orders, whatever the plan picks
            over = {"fwd.varlen": True, "fwd.varlen_compact": compact, **(fwd_extra or {})}
            out, lse = fv._forward(q, k, v, cu_q, cu_k, call, True, backend, overrides=over)
        grads = None
    else:
        res = fap.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), mode, evaluator=evaluator,
                                   backend=backend, return_lse=mode != "sigmoid", **kw)
        out, lse = res if mode != "sigmoid" else (res, None)
        grads = torch.autograd.grad(out, (q, k, v), dout)

    # per-sequence references, packed back; rows without keys: O = 0, LSE = -inf, no gradient
    qd, kd, vd = (t.detach() for t in (q, k, v))
    parts = {n: [] for n in ("ref", "low", "ref_lse", "low_lse", "rdq", "ldq")}
    kparts = {n: [] for n in ("rdk", "rdv", "ldk", "ldv")}
    mag = {"o": 0.0, "dq": 0.0, "dk": 0.0, "dv": 0.0}
    oq, ok_ = 0, 0
    with torch.no_grad():
        for sq, sk in zip(lens_q, lens_k):
            qs, ks, vs, ds = qd[None, oq:oq + sq], kd[None, ok_:ok_ + sk], vd[None, ok_:ok_ + sk], dout[None, oq:oq + sq]
            if sq and sk:
                ref, ref_lse = R.attention_ref(qs, ks, vs, mode, **kw)
                low, low_lse = R.attention_ref_lowprec(qs, ks, vs, mode, **kw)
                rg = R.attention_ref_backward(ds, qs, ks, vs, mode, **kw)
                lg = H.lowprec_backward(ds, qs, ks, vs, low, mode, **kw)
                m = H.magnitudes(ds, qs, ks, vs, ref, mode, **kw)
                mag = {n: max(mag[n], m[n]) for n in mag}
            else:
                z = lambda t, dtype=torch.float64: torch.zeros(t.shape, dtype=dtype, device=device)
                ref, low = z(qs), z(qs, dt)
                ninf = torch.full((1, hq, sq), -float("inf"), dtype=torch.float64, device=device)
                ref_lse, low_lse = ninf, ninf.float()
                rg, lg = (z(qs), z(ks), z(vs)), (z(qs, dt), z(ks, dt), z(vs, dt))
            for n, t in (("ref", ref), ("low", low), ("rdq", rg[0]), ("ldq", lg[0])):
                parts[n].append(t[0])
            if mode != "sigmoid":
                parts["ref_lse"].append(ref_lse[0])
                parts["low_lse"].append(low_lse[0])
            for n, t in (("rdk", rg[1]), ("rdv", rg[2]), ("ldk", lg[1]), ("ldv", lg[2])):
                kparts[n].append(t[0])
            oq, ok_ = oq + sq, ok_ + sk
        cat = lambda ts, dim=0: torch.cat(ts, dim)
        checks = {"o": H.judge("o", out, cat(parts["ref"]), cat(parts["low"]), dt, mag["o"])}
        if mode != "sigmoid":
            checks["lse"] = H.judge("lse", lse, cat(parts["ref_lse"], 1), cat(parts["low_lse"], 1), dt)
        if grads is not None:
            for n, got, r, lo in (("dq", grads[0], cat(parts["rdq"]), cat(parts["ldq"])),
                                  ("dk", grads[1], cat(kparts["rdk"]), cat(kparts["ldk"])),
                                  ("dv", grads[2], cat(kparts["rdv"]), cat(kparts["ldv"]))):
                checks[n] = H.judge(n, got, r, lo, dt, mag[n])
    return checks


def _assert_ok(checks):
    bad = {n: c["why"] for n, c in checks.items() if not c["ok"]}
    assert not bad, bad


SIGMOID_DEFAULT_BIAS = [   # packed sigmoid at the default bias -ln S_k of each sequence (ScoreSpec.seq_bias)
    ("sigmoid", "poly", "bf16", 128, True, (-1, -1), None),
    ("sigmoid", "poly", "bf16", 256, False, (-1, -1), None),   # the chunked D = 256 backward at this grid
]


@pytest.mark.gpu
@pytest.mark.parametrize("var", SIGMOID_DEFAULT_BIAS, ids=lambda v: f"d{v[3]}-c{int(v[4])}")
def test_varlen_sigmoid_default_bias_rule(var):
    """The public call at sigmoid's default bias runs the varlen kernels (one launch each way, the
    kernels adding each sequence's -ln S_k) and meets the FlashAttention rule against per-sequence
    references at their own -ln S_k, on lengths from 0 and 1 to a few hundred (a wrong bias, e.g.
    one -ln S_k for all, moves O by the ratio of the lengths)."""
    lens_q, lens_k = [37, 0, 1, 300, 5, 129], [37, 3, 1, 300, 250, 129]
    dev = torch.device("cuda")
    q = torch.empty(sum(lens_q), 4, var[3], device=dev, dtype=H.DTYPES[var[2]])
    k = torch.empty(sum(lens_k), 2, var[3], device=dev, dtype=H.DTYPES[var[2]])
    call = fv.validate(q, k, k, _cu(lens_q, dev), _cu(lens_k, dev), max(lens_q), max(lens_k), "sigmoid", "poly",
                       var[4], None, None)
    vp = fv._varlen_plan(call, dev)
    assert vp.fwd.varlen and vp.bwd.varlen and vp.score.seq_bias and vp.sigmoid_bias == 0.0
    _assert_ok(run_and_judge(var, lens_q, lens_k, 7, "cuda", "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases())
def test_varlen_rule_fuzz(var, lens_q, lens_k, seed):
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases())
@pytest.mark.parametrize("compact", [False, True], ids=["slots", "compact"])
def test_varlen_kernel_forward_rule_fuzz(var, lens_q, lens_k, seed, compact):
    """The varlen forward kernel (one persistent launch for the batch) by the same rule: O and LSE;
    the slot order and the compact order (override fwd.varlen_compact: live tiles only; the plan
    takes it for ragged batches)."""
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel=True, compact=compact))


@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases())
def test_varlen_kernel_forward_dry_run(var, lens_q, lens_k, seed, monkeypatch):
    """test_varlen_kernel_forward_rule_fuzz's body on the CPU, the kernel launch stood in by the
    reference (kernels.dispatch.forward_varlen's contract: packed O and (H_q, total_q) LSE): the
    plan override, the launch arguments and the judging run here."""
    from flash_attn_poly.kernels import dispatch
    seen = []

    def stand_in(vp, q, k, v, cu_q, cu_k, max_q):
        c = vp.call
        assert vp.fwd.varlen and c.varlen and max_q == max(lens_q)
        assert vp.fwd.persistent > 0
        seen.append(c)
        out, lse = fv._forward(q, k, v, cu_q, cu_k, varlen_call_of(c, max_q, c.seqlen_k), True, "reference")
        return out, (None if c.mode == "sigmoid" else lse)

    monkeypatch.setattr(dispatch, "forward_varlen", stand_in)
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "cuda", "cpu", kernel=True))
    assert len(seen) == (1 if sum(lens_q) and max(lens_q) else 0)


def bwd_cases():
    """The fuzz cases, and one with empty and one-token sequences on both sides and tails past a
    key block and a query block."""
    return cases() + [pytest.param(VARIANTS[0], [1, 0, 200, 65, 0], [1, 3, 200, 0, 130], 7, id="softmax-fixed-0-1")]


# (head_loop, dq_halves) of the varlen backward: a CTA per query head, per KV head, and per KV head
# with the staged dQ tile in warpgroup halves (D = 128 only: tile_m 64's column halves, the dense
# default there; D = 64 varlen keeps one buffer, D = 256 stages no dQ)
BWD_BUILDS = [pytest.param(False, False, id="per_head"), pytest.param(True, False, id="head_loop"),
              pytest.param(True, True, id="head_loop_dq_halves")]


def _skip_halves(var, dq_halves):
    if dq_halves and var[3] != 128:
        pytest.skip("dq_halves: timed and tested at D = 128 only")


@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", bwd_cases())
@pytest.mark.parametrize("head_loop, dq_halves", BWD_BUILDS)
def test_varlen_kernel_backward_rule_fuzz(var, lens_q, lens_k, seed, head_loop, dq_halves):
    """The varlen backward kernels (one pre, main and post launch for the batch) by the same rule:
    dQ, dK, dV (and O, LSE of the per-sequence forward); a CTA per query head (the plan's) or per
    KV head over its query heads (override bwd.head_loop), with dQ's staged tile in warpgroup
    halves (override bwd.dq_halves).  Run on the H200:
        python -m pytest -q -p no:cacheprovider -m gpu tests/test_varlen_gpu.py -k kernel_backward"""
    _skip_halves(var, dq_halves)
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel_bwd=True, head_loop=head_loop,
                             dq_halves=dq_halves))


# the backward's step order on packed sequences (p_turns + dq_defer over the staged dQ halves, which
# dq_defer needs; the dense rows take it for D = 64 from 2k keys and the D = 128 softcap, packed calls
# keep the warpgroups in step until it is timed there): by the rule, on the per-KV-head loop
STEP_ORDER = {"bwd.p_turns": True, "bwd.dq_defer": True}


@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", [c for c in bwd_cases() if c.values[0][3] in (64, 128)])
def test_varlen_kernel_backward_step_order(var, lens_q, lens_k, seed):
    """The varlen backward with the warpgroups staggered (tests/test_bwd_step_order_gpu.py has the
    dense contrast) by the FlashAttention rule, empty and one-token sequences included."""
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel_bwd=True, head_loop=True,
                             dq_halves=True, bwd_extra=STEP_ORDER))


# the backward's CTA table in block order (bwd.varlen_order, kernels/tile_scheduler.varlen_bwd_table:
# each sequence's key blocks ascending, heads fastest in the dense grid's sections of heads): the same
# entries in another order, so only dQ's add order changes; by the rule, on both loops, empty and
# one-token sequences included
@pytest.mark.gpu
@pytest.mark.parametrize("var, lens_q, lens_k, seed", [c for c in bwd_cases() if c.values[0][3] in (64, 128)])
@pytest.mark.parametrize("head_loop", [False, True], ids=["per_head", "head_loop"])
def test_varlen_kernel_backward_block_order(var, lens_q, lens_k, seed, head_loop):
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel_bwd=True, head_loop=head_loop,
                             bwd_extra={"bwd.varlen_order": "block"}))


# the swapped D = 256 backward over packed sequences (the plan's packed D = 256 build of the built-in
# scores, kernels/attn_bwd_swap_sm90.py AttnBwdSm90SwapVarlen; named here so the cases test it whatever
# the rows pick): every score, a window, the sigmoid dO tail zeroing, empty and one-token sequences,
# key tails inside the 64-key tile
SWAP_OVERRIDES = {"bwd.swap": True, "bwd.tile_n": 64, "bwd.stages": 2, "bwd.dp_first": False}
SWAP_VARIANTS = [
    ("softmax", "native", "bf16", 256, True, (-1, -1), None),
    ("softcap", "poly", "bf16", 256, True, (-1, -1), 30.0),
    ("sigmoid", "poly", "bf16", 256, True, (-1, -1), None),
    ("softmax", "native", "bf16", 256, False, (48, 16), None),
]


def swap_cases():
    fixed = [pytest.param(SWAP_VARIANTS[0], [1, 0, 200, 65, 0], [1, 3, 200, 0, 130], 7, id="swap-softmax-fixed-0-1")]
    return drawn_cases(SWAP_VARIANTS, FUZZ_SEED + 256, 2, fixed, prefix="swap-")


@pytest.mark.gpu
@pytest.mark.parametrize("order", ["unit", "block"])
@pytest.mark.parametrize("var, lens_q, lens_k, seed", swap_cases())
def test_varlen_swap_backward_rule_fuzz(var, lens_q, lens_k, seed, order):
    """The swapped D = 256 backward over packed sequences (per-KV-head loop) by the rule, its CTA
    table in either order (bwd.varlen_order)."""
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "cuda", "cuda", kernel_bwd=True, head_loop=True,
                             bwd_extra={**SWAP_OVERRIDES, "bwd.varlen_order": order}))


@pytest.mark.parametrize("var, lens_q, lens_k, seed", bwd_cases())
@pytest.mark.parametrize("head_loop, dq_halves", BWD_BUILDS)
def test_varlen_kernel_backward_dry_run(var, lens_q, lens_k, seed, head_loop, dq_halves, monkeypatch):
    """test_varlen_kernel_backward_rule_fuzz's body on the CPU, the launches stood in by the
    reference (kernels.dispatch.backward_varlen's contract: packed dq, dk, dv); the stand-in also
    runs the pre kernel's torch oracle on the launch's arguments (padded rows inside the buffer,
    +inf / 0 tails) so the plan override, the arguments and the judging run here."""
    from flash_attn_poly.kernels import attn_bwd_prepost as pre_ref, dispatch
    seen = []

    def stand_in(vp, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k):
        c = vp.call
        assert vp.bwd.varlen and vp.bwd.head_loop == head_loop and vp.bwd.dq_halves == dq_halves
        assert not vp.bwd.lpt and c.varlen
        assert (max_q, max_k) == (max(lens_q), max(lens_k)) and cu_q.dtype == cu_k.dtype == torch.int32
        needs = c.mode != "sigmoid"
        if needs:
            assert lse.shape == (q.shape[1], q.shape[0])
            lse2, dsum = pre_ref.preprocess_varlen(dout, out, lse, cu_q.tolist(), True, True)
            owned = pre_ref.varlen_owned_rows(cu_q.tolist())
            assert not torch.isnan(lse2[0][:, owned]).any() and not torch.isnan(dsum[0][:, owned]).any()
        seen.append(c)
        return fv._backward(dout, q, k, v, cu_q, cu_k, out, lse, varlen_call_of(c, max_q, max_k), "reference")

    monkeypatch.setattr(dispatch, "backward_varlen", stand_in)
    _skip_halves(var, dq_halves)
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "cuda", "cpu", kernel_bwd=True, head_loop=head_loop,
                             dq_halves=dq_halves))
    assert len(seen) == (1 if sum(lens_q) and sum(lens_k) else 0)


@pytest.mark.parametrize("var, lens_q, lens_k, seed", cases())
def test_varlen_rule_reference_dry_run(var, lens_q, lens_k, seed):
    """The GPU test's body on the CPU through the reference backend (exact functions in FP32):
    the packing, the per-sequence references and the judging run here."""
    _assert_ok(run_and_judge(var, lens_q, lens_k, seed, "reference", "cpu"))


def test_the_draws_hold_empty_and_single_token_sequences():
    drawn = [p.values for p in cases()]
    lens = [n for _, lq, lk, _ in drawn for n in lq + lk]
    assert 0 in lens and 1 in lens and max(lens) > 128   # a tail longer than one tile
    assert any(lq != lk for _, lq, lk, _ in drawn)


@pytest.mark.gpu
def test_backward_table_kernel_matches_the_torch_build():
    """The one-launch CTA table (kernels/varlen_table_sm90.py) equals the torch ops' build
    (tile_scheduler._bwd_table) word for word up to its count, over random length lists with
    0s, 1s and ties, 1 to VARLEN_TABLE_MAX_SEQS sequences, both orders (sections of one head, of
    all heads, a narrower last section) and both key tiles; varlen_bwd_table takes it for ragged
    lists on a GPU and the torch ops past VARLEN_TABLE_MAX_SEQS sequences."""
    import itertools
    import unittest.mock as mock
    from flash_attn_poly.kernels import tile_scheduler as T
    rng = np.random.default_rng(FUZZ_SEED)
    lists = [[0], [1], [0, 0, 5], [4096] * 8 + [1], [300, 0, 1, 128, 129, 700, 128, 128], [5278, 63, 1191, 0, 1]]
    lists += [list(rng.choice([0, 1, 64, 127, 128, 129, 1000], size=int(n))) for n in (17, 100, 1024)]
    lists += [[int(x) for x in np.minimum(rng.lognormal(7, 1.2, size=int(n)), 16384)] for n in (24, 300, 1024)]
    checked = 0
    for lens, tile_n, (heads, section) in itertools.product(lists, (64, 128), ((8, 1), (8, 8), (32, 5), (3, 2))):
        cu = torch.tensor([0] + list(itertools.accumulate(int(x) for x in lens)), dtype=torch.int32, device="cuda")
        mx, total = max(max(lens), 1), int(sum(lens))
        want = T._bwd_table(cu, mx, tile_n, heads, total, section)
        got = T.bwd_table_kernel(cu, mx, tile_n, heads, total, section)
        count = int(want[0])
        assert got.numel() == want.numel() and int(got[0]) == count, (lens[:8], tile_n, heads, section)
        n = 1 + T.BWD_TABLE_WORDS * count
        assert torch.equal(got[:n], want[:n]), (len(lens), tile_n, heads, section)
        checked += 1
    assert checked == len(lists) * 2 * 4
    ragged = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
    with mock.patch.object(T, "_bwd_table", side_effect=AssertionError("torch ops")):
        T.varlen_bwd_table(ragged, 200, 128, 8, 300, 8)               # the kernel
    lens = [1, 2] * (T.VARLEN_TABLE_MAX_SEQS // 2) + [1]          # one sequence too many, ragged
    long = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    with mock.patch.object(T, "bwd_table_kernel", side_effect=AssertionError("kernel")):
        table = T.varlen_bwd_table(long, 2, 128, 8, sum(lens), 8)
    assert int(table[0]) == len(lens) * 8
    with pytest.raises(ValueError, match=f"at most {T.VARLEN_TABLE_MAX_SEQS} sequences"):
        T.bwd_table_kernel(long, 2, 128, 8, sum(lens), 8)


@pytest.mark.gpu
def test_compact_table_kernel_matches_the_torch_build():
    """The forward's compact order in one launch (kernels/varlen_table_sm90.py CompactTableKernel)
    equals the torch ops' build (tile_scheduler._compact_table) up to its count, over length lists
    with 0s, 1s and ties, 1 to VARLEN_TABLE_MAX_SEQS sequences and three query tiles; lists past
    VARLEN_TABLE_MAX_SEQS sequences take the torch ops."""
    import itertools
    import unittest.mock as mock
    from flash_attn_poly.kernels import tile_scheduler as T
    rng = np.random.default_rng(FUZZ_SEED + 1)
    lists = [[0], [1], [0, 0, 5], [4096] * 8 + [1], [300, 0, 1, 128, 129, 700, 128, 128], [5278, 63, 1191, 0, 1]]
    lists += [list(rng.choice([0, 1, 64, 127, 128, 129, 1000], size=int(n))) for n in (33, 100, 1024)]
    lists += [[int(x) for x in np.minimum(rng.lognormal(7, 1.2, size=int(n)), 16384)] for n in (24, 300, 1024)]
    for lens, tile_m in itertools.product(lists, (64, 128, 192)):
        cu = torch.tensor([0] + list(itertools.accumulate(int(x) for x in lens)), dtype=torch.int32, device="cuda")
        mx = max(max(lens), 1)
        levels = -(-mx // tile_m)
        want = T._compact_table(cu, levels, tile_m)
        got = T.compact_varlen_table(cu, mx, tile_m)
        n = 1 + int(want[0])
        assert got.numel() == want.numel() and torch.equal(got[:n], want[:n]), (len(lens), tile_m)
    lens = [1, 2] * (T.VARLEN_TABLE_MAX_SEQS // 2) + [1]
    long = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    with mock.patch.object(T, "_table_fn", side_effect=AssertionError("kernel")):
        table = T.compact_varlen_table(long, 2, 128)
    assert int(table[0]) == len(lens)


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[300, 0, 1, 129, 700], [256] * 4], ids=["ragged", "equal"])
def test_varlen_call_captures_in_a_cuda_graph(lens):
    """An unchecked packed call (check_inputs=False: no host read of the offsets) forward and
    backward captures in one CUDA graph: its tile tables are kernel launches (the cached
    equal-length table is not used inside a capture); the replay's output equals the eager
    call's bit for bit, its gradients to the order of dQ's atomic adds.

    The eager reference runs on clones of the leaves: on torch 2.11 a backward captured after an
    eager backward on the legacy default stream through the same leaves (its outputs alive) is
    invalidated (cudaErrorStreamCaptureImplicit, raised in the autograd engine after our last
    launch; pure torch ops fail the same way, and the capture works without the eager call), so
    the captured leaves meet autograd first on the side stream, as torch's capture recipe does."""
    import itertools
    cu = torch.tensor([0] + list(itertools.accumulate(lens)), dtype=torch.int32, device="cuda")
    mx, total = max(lens), sum(lens)
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v = (torch.randn(total, h, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for h in (4, 2, 2))
    dout = torch.randn(total, 4, 128, device="cuda", dtype=torch.bfloat16, generator=g)

    def step(q, k, v):
        out = fap.attention_varlen(q, k, v, cu, cu, mx, mx, "softmax", check_inputs=False)
        return tuple(t.detach() for t in (out, *torch.autograd.grad(out, (q, k, v), dout)))
    eager = step(*(t.detach().clone().requires_grad_() for t in (q, k, v)))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step(q, k, v)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static[0], eager[0])
    for a, b in zip(static[1:], eager[1:]):
        assert float((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30)) < 2e-3   # a wrong table: O(1)
