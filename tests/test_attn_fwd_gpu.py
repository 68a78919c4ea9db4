"""GPU tests of the Hopper attention forward (kernels/attn_fwd_sm90.py).

Each case: fresh random inputs, NaN-poisoned outputs, the kernel against the FP64
reference with the one tolerance rule (flash_attn_poly.testing): error <= 2x the error
of torch's own same-dtype pipeline + floor.  Poly evaluators are judged against the
exact function with a looser factor here (their accuracy vs the program they run is the
asm/fit tests' business).

`python tests/test_attn_fwd_gpu.py [--quick] [--time]` runs the cases as a table and, with
--time, times the B=1 S=4096 Hq=32 Hkv=8 D=128 causal BF16 shape per mode.
"""
from __future__ import annotations

import math
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


def _program_score_fn(mode, s_k, softcap=50.0, stage=None, key_block=128):
    """The math the default poly stage runs, per key column: the program replay (exact bf16
    rounding) for the columns its poly_split sends through the block, the exact function
    for its MUFU columns (tests/test_attn_fwd_split.split_score_fn)."""
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_attn_fwd_split import split_score_fn
    from flash_attn_poly.kernels import score_stages as S

    return split_score_fn(mode, stage or S.make_stage(mode, "poly", key_block=key_block), s_k, softcap)


def run_case(mode, evaluator, dtype, b, s_q, s_k, h_q, h_kv, d, causal, tuning=None,
             qkv=None, softcap=50.0, stage=None):
    from flash_attn_poly import reference, testing
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd

    # softcap: spread scores over tens of logits (Gemma-2-like), so the cap matters
    q, k, v = qkv if qkv is not None else _inputs(dtype, b, s_q, s_k, h_q, h_kv, d, 8.0 if mode == "softcap" else 1.0)
    kw = dict(causal=causal, softcap=softcap if mode == "softcap" else None)
    out = testing.poison_(torch.empty_like(q))
    lse = testing.poison_(torch.empty(b, h_q, s_q, device="cuda"))
    o, l = attn_fwd(q, k, v, mode=mode, evaluator=evaluator, out=out, lse=lse, tuning=tuning, stage=stage, **kw)
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention_ref(q, k, v, mode, **kw)
    # the same-dtype pipeline, with the kernel's constant row max where it uses one
    m0 = testing.fixed_max_m0(mode, q.dtype, softcap, tuning)
    low, _ = reference.attention_ref_lowprec(q, k, v, mode, fixed_max=m0, **kw)
    st = {}
    if evaluator == "poly":
        # judge against the program the kernel runs (tight) and report the exact-function error
        st["exact_err"] = testing.max_abs_err(o, ref)
        from flash_attn_poly.kernels import score_stages as S
        key_block = (tuning or {}).get("tile_n", S.default_key_block(d))   # attn_fwd's default split
        fn = _program_score_fn(mode, s_k, softcap, stage, key_block)
        ref, ref_lse = reference.attention_ref(q, k, v, mode, score_fn=fn, **kw)
        low, _ = reference.attention_ref_lowprec(q, k, v, mode, score_fn=fn, fixed_max=m0, **kw)
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
# several splits, BF16 (constant row max) and FP16 (online max), tails, D 64/128/256
ODD_CASES = [("softcap", "poly", "bf16", 1, 257, 257, 4, 1, 128, True),
             ("softcap", "poly", "fp16", 2, 200, 333, 8, 2, 64, False),
             ("softcap", "poly", "bf16", 1, 300, 300, 4, 2, 256, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("split", [(1, 16), (1, 2), (1, 1)], ids=lambda s: f"{s[0]}of{s[1]}")
@pytest.mark.parametrize("case", ODD_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attn_fwd_softcap_odd_program(case, split):
    from flash_attn_poly.kernels import score_stages as S
    stage = S.make_stage("softcap", "poly", program="softcap_c50_f16_odd", poly_split=split)
    if not S.split_fits_block(split, S.default_key_block(case[8])):   # 1/16 at D = 256 (64-key blocks)
        with pytest.raises(ValueError, match="repeats every 128 keys"):
            run_case(*case, stage=stage)
        return
    run_case(*case, stage=stage)


# the online-softmax row-sum order knob (AttnFwdConfig.row_sum_carry): both settings, the
# stages that use the online softmax, masked tails, both dtypes, D 64/128/256
ROW_SUM_CASES = [c for i, c in enumerate(CASES) if i in (1, 3, 4, 5, 6, 7, 8, 13)]


@pytest.mark.gpu
@pytest.mark.parametrize("carry", [False, True], ids=["carry0", "carry1"])
@pytest.mark.parametrize("case", ROW_SUM_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attn_fwd_row_sum_carry(case, carry):
    run_case(*case, tuning={"row_sum_carry": carry})


# softcap with a constant row max (AttnFwdConfig.fixed_max, on by default for BF16 and cap <= 50):
# both settings, both evaluators, D 64/128/256, causal or not, tails
FIXED_MAX_CASES = [
    ("softcap", "native", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("softcap", "poly", "bf16", 1, 333, 333, 8, 2, 128, True),
    ("softcap", "native", "bf16", 2, 300, 411, 4, 4, 64, False),
    ("softcap", "poly", "bf16", 1, 200, 517, 8, 1, 64, True),
    ("softcap", "native", "bf16", 1, 517, 517, 8, 4, 256, True),
    ("softcap", "poly", "bf16", 1, 300, 411, 4, 2, 256, False),
]


# the online max and the constant max
FIXED_MAX_TUNINGS = {"online": {"fixed_max": False}, "fixed": {"fixed_max": True}}


@pytest.mark.gpu
@pytest.mark.parametrize("setting", list(FIXED_MAX_TUNINGS))
@pytest.mark.parametrize("case", FIXED_MAX_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attn_fwd_softcap_fixed_max(case, setting):
    run_case(*case, tuning=FIXED_MAX_TUNINGS[setting])


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
@pytest.mark.parametrize("evaluator", ["native", "poly"])
@pytest.mark.parametrize("cap", [50.0, 10.0])
def test_attn_fwd_softcap_fixed_max_range_ends(sign, evaluator, cap):
    b, s, h_q, h_kv, d = 1, 300, 4, 2, 128
    run_case("softcap", evaluator, "bf16", b, s, s, h_q, h_kv, d, True, tuning={"fixed_max": True},
             qkv=_saturating_inputs(b, s, h_q, h_kv, d, sign), softcap=cap)


# the online softmax's stale-max threshold (AttnFwdConfig.rescale_threshold): softmax's default
# is 8, so CASES' softmax rows (tails, D 64/128/256, BF16/FP16) run it; the softcap stage keeps
# the online max on FP16 inputs, where the threshold is off by default: that case here
RESCALE_CASES = [
    ("softcap", "native", "fp16", 1, 333, 333, 8, 2, 128, True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", RESCALE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_attn_fwd_rescale_threshold(case):
    run_case(*case, tuning={"rescale_threshold": 8.0})


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
    run_case("softmax", "native", "bf16", b, s, s, h_q, h_kv, d, True, tuning={"rescale_threshold": threshold},
             qkv=(q, k, v))


def time_main_shape(modes, b=1, s=4096, h_q=32, h_kv=8, d=128, reps=30):
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd

    q, k, v = _inputs("bf16", b, s, s, h_q, h_kv, d)
    rows = []
    flops = 4 * b * h_q * s * s * d / 2
    for mode, ev, *tune in modes:
        tuning = tune[0] if tune else None
        fn = lambda: attn_fwd(q, k, v, mode=mode, evaluator=ev, causal=True,
                              softcap=50.0 if mode == "softcap" else None, tuning=tuning)
        for _ in range(5):
            fn()
        ts = []
        for _ in range(reps):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); fn(); e1.record(); torch.cuda.synchronize()
            ts.append(e0.elapsed_time(e1))
        ms = sorted(ts)[len(ts) // 2]
        tag = "" if not tuning else " " + ",".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in tuning.items())
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
        modes = [("softmax", "native", dict(pingpong=False)),
                 ("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
                 ("sigmoid", "native"), ("sigmoid", "poly"),
                 ("softcap", "native", dict(pingpong=False)), ("sigmoid", "poly", dict(pingpong=False))]
        print(f"\n{'B=1 S=4096 Hq=32 Hkv=8 D=128 causal bf16':44s} {'ms':>7s} {'TFLOP/s':>8s}")
        for name, ms, tf in time_main_shape(modes):
            print(f"{name:44s} {ms:7.3f} {tf:8.1f}", flush=True)
    return 1 if n_bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
