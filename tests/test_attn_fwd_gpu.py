"""GPU tests of the Hopper attention forward (kernels/attn_fwd_sm90.py).

Each case: fresh random inputs, the plan attention() resolves for it (plan overrides for the
non-default builds), NaN-poisoned outputs, the kernel against the FP64 reference with the one
tolerance rule (flash_attn_poly.testing): error <= 2x the error of torch's own same-dtype
pipeline + floor.  Poly scores are judged against the reference that replays their program
(tests/plan_reference.py); the error against the exact function is reported.

`python tests/test_attn_fwd_gpu.py [--quick] [--time]` runs the cases as a table and, with
--time, times the B=1 S=4096 Hq=32 Hkv=8 D=128 causal BF16 shape per mode.
"""
from __future__ import annotations

import sys
import time

try:
    import pytest
    torch = pytest.importorskip("torch")
except ImportError:  # the device machine may run this file as a plain script
    import torch

    class _Mark:
        def __getattr__(self, _):
            return lambda *a, **k: (lambda f: f)

    class pytest:  # noqa: N801 - minimal stand-in so the decorators below still parse
        mark = _Mark()

CASES = [
    # (mode, evaluator, dtype, B, S_q, S_k, H_q, H_kv, D, causal)
    ("softmax", "native", "bf16", 2, 256, 256, 4, 4, 128, True),
    ("softmax", "native", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("softmax", "native", "bf16", 2, 200, 517, 8, 1, 128, True),
    ("softmax", "native", "bf16", 1, 517, 200, 4, 1, 128, True),
    ("softmax", "native", "bf16", 2, 300, 411, 8, 8, 128, False),
    ("softmax", "native", "bf16", 1, 257, 257, 8, 2, 64, True),
    ("softmax", "native", "fp16", 1, 381, 381, 8, 2, 128, True),
    ("softcap", "native", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("softcap", "poly", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("sigmoid", "native", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("sigmoid", "poly", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("sigmoid", "native", "bf16", 1, 300, 411, 4, 4, 128, False),
    # head_dim 256 (Gemma-2; forward only, tile 128 x 64)
    ("softmax", "native", "bf16", 1, 333, 333, 8, 4, 256, True),
    ("softcap", "native", "bf16", 1, 333, 333, 8, 4, 256, True),
    ("softcap", "poly", "bf16", 1, 517, 517, 8, 4, 256, True),
    ("sigmoid", "poly", "bf16", 1, 300, 411, 4, 2, 256, False),
]

QUICK = {0, 2, 3, 4, 7, 8, 9, 10}


def _inputs(dtype, b, s_q, s_k, h_q, h_kv, d, scale_scores=1.0):
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    q = (torch.randn(b, s_q, h_q, d, device="cuda") * scale_scores).to(dt)
    k = torch.randn(b, s_k, h_kv, d, device="cuda").to(dt)
    v = torch.randn(b, s_k, h_kv, d, device="cuda").to(dt)
    return q, k, v


# the FP16 tanh program: softcap's poly default for FP16 inputs and caps above 50 (BF16 inputs
# with cap <= 50 default to the exp2 offload, a native score); the kernel entries' default before
# the plan, so named here where a case means the program
TANH_PROGRAM = "softcap_c50_f16_odd"


def meta_qkv(dtype, b, s_q, s_k, h_q, h_kv, d):
    """q, k, v on torch's meta device: what a plan resolves for these shapes, without a GPU."""
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    return tuple(torch.empty(b, s, h, d, dtype=dt, device="meta") for s, h in ((s_q, h_q), (s_k, h_kv), (s_k, h_kv)))


def run_case(mode, evaluator, dtype, b, s_q, s_k, h_q, h_kv, d, causal, overrides=None,
             qkv=None, softcap=50.0, program=None):
    """The forward of the plan attention() resolves for the case (plan overrides: "fwd.<field>",
    "poly_split"; program: attention(program=)) into NaN-poisoned O and LSE, against the FP64
    reference with the tolerance rule; poly scores against their program's replay."""
    import plan_reference
    from flash_attn_poly import reference, testing

    # softcap: spread scores over tens of logits (Gemma-2-like), so the cap matters
    q, k, v = qkv if qkv is not None else _inputs(dtype, b, s_q, s_k, h_q, h_kv, d, 8.0 if mode == "softcap" else 1.0)
    kw = dict(causal=causal, softcap=softcap if mode == "softcap" else None)
    o, l, plan = testing.run_forward(q, k, v, mode, evaluator, overrides, poison=True, program=program, **kw)
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention_ref(q, k, v, mode, **kw)
    # the same math in torch at the input precision (also for the constant row max: the kernel
    # divides O by the sum of the rounded P, so a one-key row is exact as torch's)
    low, _ = reference.attention_ref_lowprec(q, k, v, mode, **kw)
    st = {}
    fn, _ = plan_reference.score_fns(plan)
    if fn is not None:
        # judge against the program the kernel runs (tight) and report the exact-function error
        st["exact_err"] = testing.max_abs_err(o, ref)
        ref, ref_lse = reference.attention_ref(q, k, v, mode, score_fn=fn, **kw)
        low, _ = reference.attention_ref_lowprec(q, k, v, mode, score_fn=fn, **kw)
    st.update(testing.assert_close_rule(o, ref, low, factor=2.0, floor=1e-3, name=f"{mode}/{evaluator} O"))
    if l is not None:
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(l), fin), "LSE -inf pattern differs from the reference"
        st["lse_err"] = testing.max_abs_err(l[fin], ref_lse[fin])
        assert st["lse_err"] < 2e-3 * max(1.0, ref_lse[fin].abs().max().item()), st
    return st


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_attn_fwd(case):
    run_case(*case)


# the odd_u2 softcap program (fit/softcap_odd.py: clamp on the FMA pipe, true odd polynomial):
# several splits (None: the plan's), BF16 (constant row max) and FP16 (online max), tails, D 64/128/256
ODD_CASES = [("softcap", "poly", "bf16", 1, 257, 257, 4, 1, 128, True),
             ("softcap", "poly", "fp16", 2, 200, 333, 8, 2, 64, False),
             ("softcap", "poly", "bf16", 1, 300, 300, 4, 2, 256, True)]
# two consumer warpgroups on 128-key blocks, ping-pong (a poly score's base): where a split
# repeats every 128 keys, BF16 softcap's default three-warpgroup tile (64-key blocks) cannot run it
TWO_WG_TILE = {"fwd.tile_m": 128, "fwd.tile_n": 128, "fwd.num_stages": 2, "fwd.pingpong": True}


@pytest.mark.gpu
@pytest.mark.parametrize("split", [None, (1, 16), (1, 2), (1, 1)],
                         ids=lambda s: "default" if s is None else f"{s[0]}of{s[1]}")
@pytest.mark.parametrize("case", ODD_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attn_fwd_softcap_odd_program(case, split):
    from flash_attn_poly import testing
    from flash_attn_poly.kernels.scores import split_fits_block
    overrides = {} if split is None else {"poly_split": split}
    tile_n = testing.plan_for(*meta_qkv(*case[2:9]), "softcap", "poly", causal=case[9], softcap=50.0,
                              program=TANH_PROGRAM).fwd.tile_n
    if split is not None and not split_fits_block(split, tile_n):
        if case[8] == 256:   # 64-key blocks only (Q 128 x 256 + K/V stages fill the shared memory)
            with pytest.raises(ValueError, match="repeats every 128 keys"):
                run_case(*case, overrides=overrides, program=TANH_PROGRAM)
            return
        overrides.update(TWO_WG_TILE)
    run_case(*case, overrides=overrides, program=TANH_PROGRAM)


# the online-softmax row-sum order knob (FwdConfig.row_sum_carry): both settings, the
# scores that use the online softmax, masked tails, both dtypes, D 64/128/256
ROW_SUM_CASES = [c for i, c in enumerate(CASES) if i in (1, 3, 4, 5, 6, 7, 8, 13)]


@pytest.mark.gpu
@pytest.mark.parametrize("carry", [False, True], ids=["carry0", "carry1"])
@pytest.mark.parametrize("case", ROW_SUM_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attn_fwd_row_sum_carry(case, carry):
    run_case(*case, overrides={"fwd.row_sum_carry": carry})


# softcap with a constant row max (FwdConfig.fixed_max, on by default for BF16 and cap <= 50):
# both settings, both evaluators (poly: the exp2 offload, BF16's default, and the tanh program),
# D 64/128/256, causal or not, tails
FIXED_MAX_CASES = [
    ("softcap", "native", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("softcap", "poly", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("softcap", "native", "bf16", 2, 300, 411, 4, 4, 64, False),
    ("softcap", "poly", "bf16", 1, 200, 517, 8, 1, 64, True),
    ("softcap", "native", "bf16", 1, 517, 517, 8, 4, 256, True),
    ("softcap", "poly", "bf16", 1, 300, 411, 4, 2, 256, False),
]
FIXED_MAX_RUNS = [(c, None) for c in FIXED_MAX_CASES] + [(c, TANH_PROGRAM) for c in FIXED_MAX_CASES if c[1] == "poly"]


# the online max (no constant max: no exp2 offload either) and the constant max
FIXED_MAX_SETTINGS = {"online": {"fwd.fixed_max": False, "fwd.exp2_fma": 0}, "fixed": {"fwd.fixed_max": True}}


@pytest.mark.gpu
@pytest.mark.parametrize("setting", list(FIXED_MAX_SETTINGS))
@pytest.mark.parametrize("case,program", FIXED_MAX_RUNS,
                         ids=lambda x: "default" if x is None else "-".join(map(str, x)) if isinstance(x, tuple) else x)
def test_attn_fwd_softcap_fixed_max(case, program, setting):
    run_case(*case, overrides=FIXED_MAX_SETTINGS[setting], program=program)


def _saturating_inputs(b, s, h_q, h_kv, d, sign):
    """Every score of every row near sign * (a large logit): q along +-1, k along +1 plus
    noise, so the capped logits of a whole row sit at -c (sign -1) or +c (sign +1) -- the
    ends of the fixed max's range (p ~ e^-80 or e^20)."""
    g = torch.Generator(device="cuda").manual_seed(7)
    q = sign * (4.0 + torch.rand(b, s, h_q, d, device="cuda", generator=g))
    k = 4.0 + torch.rand(b, s, h_kv, d, device="cuda", generator=g)
    v = torch.randn(b, s, h_kv, d, device="cuda", generator=g)
    return tuple(t.to(torch.bfloat16) for t in (q, k, v))


@pytest.mark.gpu
@pytest.mark.parametrize("sign", [-1.0, 1.0], ids=["all_at_minus_c", "all_at_plus_c"])
@pytest.mark.parametrize("evaluator,program", [("native", None), ("poly", None), ("poly", TANH_PROGRAM)],
                         ids=["native", "poly", "poly-tanh"])
@pytest.mark.parametrize("cap", [50.0, 10.0])
def test_attn_fwd_softcap_fixed_max_range_ends(sign, evaluator, program, cap):
    b, s, h_q, h_kv, d = 1, 300, 4, 2, 128
    run_case("softcap", evaluator, "bf16", b, s, s, h_q, h_kv, d, True, overrides={"fwd.fixed_max": True},
             qkv=_saturating_inputs(b, s, h_q, h_kv, d, sign), softcap=cap, program=program)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("evaluator", ["native", "poly"])
@pytest.mark.parametrize("mode", ["softmax", "softcap"])
def test_attn_fwd_one_key_returns_v_exactly(mode, evaluator, d):
    """A row that sees one key returns that key's V bit for bit and LSE = its logit, as torch's
    softmax does (p = 1): S_k = 1, and a window (0, 0) where every row sees only its diagonal.
    The constant row max of BF16 softcap (its default) meets this only because O is divided by
    the sum of the BF16-rounded P (kernels/scores/common.write_p_fixed); the FP32 sum of the
    unrounded P left O up to 2^-9 relative off."""
    if mode == "softmax" and evaluator == "poly":
        pytest.skip("softmax has no poly evaluator")
    from flash_attn_poly import reference, testing
    g = torch.Generator(device="cuda").manual_seed(11)
    for s_q, s_k, win in ((37, 1, (-1, -1)), (1, 1, (-1, -1)), (300, 300, (0, 0))):
        q, k, v = (torch.randn(2, s, h, d, device="cuda", generator=g).to(torch.bfloat16) * sc
                   for s, h, sc in ((s_q, 8, 3.0), (s_k, 2, 3.0), (s_k, 2, 1.0)))
        kw = dict(causal=False, window_size=win, softcap=50.0 if mode == "softcap" else None)
        o, lse, plan = testing.run_forward(q, k, v, mode, evaluator, poison=True, **kw)
        if mode == "softcap":
            assert plan.fwd.fixed_max, plan.fwd   # the default this test is about
        idx = torch.arange(s_q, device="cuda").clamp(max=s_k - 1)   # the one key of each row
        want = v[:, idx].repeat_interleave(4, dim=2)
        assert torch.equal(o, want), (s_q, s_k, win, (o.float() - want.float()).abs().max().item())
        # LSE = the row's one logit: FP32 exact for softmax; softcap's tanh.approx.f32 (relative
        # error 2^-11 on t = tanh(x / c), |x| <~ 30 here) moves the logit by up to ~7e-3
        _, lse_ref = reference.attention_ref(q, k, v, mode, **kw)
        tol = 1e-2 if mode == "softcap" else 1e-4
        assert (lse.double() - lse_ref).abs().max().item() < tol


# the online softmax's stale-max threshold (FwdConfig.rescale_threshold): softmax's default
# is 8, so CASES' softmax rows (tails, D 64/128/256, BF16/FP16) run it; the softcap score keeps
# the online max on FP16 inputs, where the threshold is off by default: that case here
RESCALE_CASES = [
    ("softcap", "native", "fp16", 1, 333, 333, 8, 2, 128, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", RESCALE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attn_fwd_rescale_threshold(case):
    run_case(*case, overrides={"fwd.rescale_threshold": 8.0})


@pytest.mark.gpu
@pytest.mark.parametrize("threshold", [0.0, 2.0, 8.0])
def test_attn_fwd_rescale_threshold_rising_scores(threshold):
    """Scores that grow towards the first keys, which the kernel visits last (key blocks run
    from the diagonal down): every block raises the row max, by more or less than the
    threshold, so both the kept-max and the rescale branches run."""
    b, s, h_q, h_kv, d = 1, 700, 4, 2, 128
    q, k, v = _inputs("bf16", b, s, s, h_q, h_kv, d, 2.0)
    ramp = 1.0 + 6.0 * (1.0 - torch.arange(s, device="cuda") / s)
    k = (k.float() * ramp[None, :, None, None]).to(torch.bfloat16)
    run_case("softmax", "native", "bf16", b, s, s, h_q, h_kv, d, True,
             overrides={"fwd.rescale_threshold": threshold}, qkv=(q, k, v))


def time_main_shape(modes, b=1, s=4096, h_q=32, h_kv=8, d=128, reps=30):
    from flash_attn_poly import testing
    from flash_attn_poly.kernels import dispatch

    q, k, v = _inputs("bf16", b, s, s, h_q, h_kv, d)
    rows = []
    flops = 4 * b * h_q * s * s * d / 2
    for mode, ev, *tune in modes:
        overrides = tune[0] if tune else None
        plan = testing.plan_for(q, k, v, mode, ev, overrides, causal=True,
                                softcap=50.0 if mode == "softcap" else None)
        fn = lambda plan=plan: dispatch.forward(plan, q, k, v)
        for _ in range(5):
            fn()
        ts = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); fn(); e1.record(); torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1))
        ms = sorted(ts)[len(ts) // 2]
        tag = "" if not overrides else " " + ",".join(
            f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in overrides.items())
        rows.append((f"ours {mode}/{ev}{tag}", ms, flops / ms / 1e9))
    return rows


def main(argv):
    quick = "--quick" in argv
    print(f"{'case':58s} {'max_err':>9s} {'lowprec':>9s} {'lse_err':>9s}  ok")
    n_bad = 0
    for i, c in enumerate(CASES):
        if quick and i not in QUICK:
            continue
        name = "-".join(map(str, c))
        t0 = time.time()
        try:
            st = run_case(*c)
            ex = f" exact_err {st['exact_err']:.2e}" if "exact_err" in st else ""
            print(f"{name:58s} {st['max_abs_err']:9.2e} {st['lowprec_err']:9.2e} "
                  f"{st.get('lse_err', float('nan')):9.2e}  ok  ({time.time() - t0:.0f}s){ex}", flush=True)
        except Exception as e:  # report every case, fail at the end
            n_bad += 1
            print(f"{name:58s} FAIL {type(e).__name__}: {str(e)[:300]}", flush=True)
    if "--time" in argv:
        modes = [("softmax", "native", {"fwd.pingpong": False}),
                 ("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
                 ("sigmoid", "native"), ("sigmoid", "poly"),
                 ("softcap", "native", {"fwd.pingpong": False}), ("sigmoid", "poly", {"fwd.pingpong": False})]
        print(f"\n{'B=1 S=4096 Hq=32 Hkv=8 D=128 causal bf16':44s} {'ms':>7s} {'TFLOP/s':>8s}")
        for name, ms, tf in time_main_shape(modes):
            print(f"{name:44s} {ms:7.3f} {tf:8.1f}", flush=True)
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
