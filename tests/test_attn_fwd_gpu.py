"""GPU tests of the Hopper attention forward (kernels/attn_fwd_sm90.py): what the catalogue does not run.

The catalogue (tests/test_correctness_gpu.py) runs every variant's default plan through
attention().  This file runs the forward's other builds and special inputs on catalogue cases
(tests/cases.py: shapes, layouts, seeds), each judged by the one rule (tests/gpu_check.py:
max |T - T_FP64| <= 2 x max |T_torch - T_FP64| + floor, for O and LSE, against the function the
plan computes: a poly plan's program replay, the exact function for a native score):
the FP16 tanh program's poly splits, the row-sum order, softcap's constant or online max (and
the ends of the constant max's range), the rescale threshold (and scores that raise the row max
block after block), and one-key rows returning V bit for bit.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_attn_fwd_gpu.py        (the H200)
    FAP_TEST_BACKEND=reference python -m pytest -q -m gpu tests/test_attn_fwd_gpu.py  (CPU dry run)
    python tests/test_attn_fwd_gpu.py --time   times the B=1 S=4096 Hq=32 Hkv=8 D=128 causal shape
"""
from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

import cases  # noqa: E402
import gpu_check as G  # noqa: E402

HONORS_TEST_BACKEND = True   # tests/conftest.py: FAP_TEST_BACKEND=reference runs these on the CPU

# the FP16 tanh program: softcap's poly default for caps above 50 (BF16 inputs with cap <= 50
# default to the exp2 offload, a native score); named where a case means the program
TANH_PROGRAM = "softcap_c50_f16_odd"
# two consumer warpgroups on 128-key blocks, ping-pong (a poly score's base): where a split
# repeats every 128 keys, BF16 softcap's default three-warpgroup tile (64-key blocks) cannot run it
TWO_WG_TILE = {"fwd.tile_m": 128, "fwd.tile_n": 128, "fwd.num_stages": 2, "fwd.pingpong": True}
SMALL = 600_000   # B x H_q x S_q x S_k of a mechanism case: its FP64 references take ~0.1 s


def _tail(c) -> bool:
    """A mid-size case with a masked tail: several key blocks, S_q or S_k not a multiple of 64."""
    return c.seqlen_q >= 64 and c.seqlen_k >= 128 and bool(c.seqlen_q % 64 or c.seqlen_k % 64)


def mid(**attrs):
    """The first mid-size tail case of the catalogue variant with these fields."""
    return cases.pick(1, where=_tail, max_size=SMALL, window=None, **attrs)[0]


# ----------------------------------------------------------------------------- poly splits
# the odd_u2 softcap program (fit/softcap_odd.py: clamp on the FMA pipe, true odd polynomial)
# at several splits (None: the plan's): BF16 (constant row max) and FP16 (online max), D 128/256
ODD_CASES = [mid(mode="softcap", evaluator="poly", dtype="bf16", head_dim=128, causal=True),
             mid(mode="softcap", evaluator="poly", dtype="fp16", head_dim=128),
             mid(mode="softcap", evaluator="poly", dtype="bf16", head_dim=256)]
SPLITS = [None, (1, 16), (1, 2), (1, 1)]


def _odd_runs():
    """(runs, refused): a split that repeats every 128 keys runs on the two-warpgroup tile where
    the default tile has 64-key blocks; at D = 256 (64-key blocks only: Q 128 x 256 + K/V stages
    fill the shared memory) the plan refuses it."""
    from flash_attn_poly.kernels.scores import split_fits_block
    runs, refused = [], []
    for c in ODD_CASES:
        tile_n = G.run(c, program=TANH_PROGRAM, fwd=True, bwd=False).plan().fwd.tile_n
        for split in SPLITS:
            ov = {} if split is None else {"poly_split": split}
            if split is not None and not split_fits_block(split, tile_n):
                if c.head_dim == 256:
                    refused.append(G.run(c, program=TANH_PROGRAM, overrides=ov, bwd=False))
                    continue
                ov.update(TWO_WG_TILE)
            runs.append(G.run(c, program=TANH_PROGRAM, overrides=ov, bwd=False))
    return runs, refused


ODD_RUNS, ODD_REFUSED = _odd_runs()


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(ODD_RUNS))
def test_attn_fwd_softcap_odd_program_splits(r):
    G.check(r)


@pytest.mark.parametrize("r", G.params(ODD_REFUSED))
def test_attn_fwd_split_that_needs_128_key_blocks_is_refused_at_d256(r):
    with pytest.raises(ValueError, match="repeats every 128 keys"):
        r.plan()


# ----------------------------------------------------------------------------- row-sum order
# FwdConfig.row_sum_carry, both settings: the online-softmax scores, masked tails, both dtypes,
# D 64/128/256, causal or not; softcap (constant max) too
ROW_SUM_CASES = [mid(mode="softmax", dtype="bf16", head_dim=128, causal=True),
                 mid(mode="softmax", dtype="bf16", head_dim=128, causal=False),
                 mid(mode="softmax", dtype="bf16", head_dim=64),
                 mid(mode="softmax", dtype="bf16", head_dim=256),
                 mid(mode="softmax", dtype="fp16", head_dim=128),
                 mid(mode="softcap", evaluator="native", dtype="bf16", head_dim=128, causal=True),
                 mid(mode="softcap", evaluator="poly", dtype="bf16", head_dim=128, causal=True)]
ROW_SUM_RUNS = [G.run(c, overrides={"fwd.row_sum_carry": carry}, bwd=False)
                for c in ROW_SUM_CASES for carry in (False, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(ROW_SUM_RUNS))
def test_attn_fwd_row_sum_carry(r):
    G.check(r)


# ----------------------------------------------------------------------------- constant row max
# softcap with a constant row max (FwdConfig.fixed_max, BF16's default for cap <= 50) and the
# online max (no constant max: no exp2 offload either): both evaluators (poly: the exp2 offload,
# BF16's default, and the tanh program), D 64/128/256, causal or not, tails
FIXED_MAX_SETTINGS = {"online": {"fwd.fixed_max": False, "fwd.exp2_fma": 0}, "fixed": {"fwd.fixed_max": True}}
FIXED_MAX_CASES = [mid(mode="softcap", evaluator=e, dtype="bf16", head_dim=d)
                   for d in (128, 64, 256) for e in ("native", "poly")]
FIXED_MAX_RUNS = [G.run(c, program=prog, overrides=FIXED_MAX_SETTINGS[s], bwd=False)
                  for c in FIXED_MAX_CASES for prog in ((None, TANH_PROGRAM) if c.evaluator == "poly" else (None,))
                  for s in FIXED_MAX_SETTINGS]


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(FIXED_MAX_RUNS))
def test_attn_fwd_softcap_fixed_max(r):
    G.check(r)


# every capped logit of a row at -c or +c: the ends of the constant max's range, caps 50 and 10
RANGE_END_RUNS = [G.run(cases.retarget(mid(mode="softcap", evaluator=e, dtype="bf16", head_dim=128, causal=True),
                                       softcap=cap),
                        program=prog, overrides={"fwd.fixed_max": True}, bwd=False, inputs=inputs)
                  for e, prog in (("native", None), ("poly", None), ("poly", TANH_PROGRAM))
                  for cap in (50.0, 10.0) for inputs in ("saturate_minus", "saturate_plus")]


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(RANGE_END_RUNS))
def test_attn_fwd_softcap_fixed_max_range_ends(r):
    G.check(r)


# ----------------------------------------------------------------------------- one key: O = V exactly
def _one_key_cases():
    """For each softmax-family score and head_dim (BF16), a catalogue case with S_k = 1 (no window;
    a non-causal variant's first where there is one: every row sees the key), and window cases
    narrowed to the diagonal ((0, 0), or (0, -1) with causal; S_q <= S_k so every row sees
    exactly one key)."""
    single = {}
    for c in sorted(cases.pick(seqlen_k=1, window=None, dtype="bf16", where=lambda c: c.mode in ("softmax", "softcap")),
                    key=lambda c: c.causal):   # stable: catalogue order within non-causal, then causal
        single.setdefault((c.mode, c.evaluator, c.head_dim), c)
    diag = [cases.retarget(cases.pick(1, mode=m, evaluator=e, window=w, where=lambda c: 64 <= c.seqlen_q <= c.seqlen_k,
                                      max_size=SMALL)[0], window_size=(0, -1) if w == "left" else (0, 0))
            for m, e, w in (("softmax", "native", "both"), ("softmax", "native", "left"),
                            ("softcap", "native", "left"), ("softcap", "poly", "both"))]
    return list(single.values()) + diag


ONE_KEY_RUNS = [G.run(c, bwd=False) for c in _one_key_cases()]


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(ONE_KEY_RUNS))
def test_attn_fwd_one_key_returns_v_exactly(r):
    """A row that sees one key returns that key's V bit for bit and LSE = its logit, as torch's
    softmax does (p = 1).  The constant row max of BF16 softcap (its default) meets this only
    because O is divided by the sum of the BF16-rounded P (kernels/scores/common.write_p_fixed);
    the FP32 sum of the unrounded P left O up to 2^-9 relative off.  Rows that see no key (causal
    S_q > S_k = 1) are the rule's (LSE -inf on both sides)."""
    from flash_attn_poly import reference as R
    res = G.check(r)
    c = r.case
    if c.mode == "softcap" and c.dtype == "bf16":
        assert res["plan"].fwd.fixed_max, res["plan"].fwd   # the default this test is about
    allowed = R.window_mask(c.seqlen_q, c.seqlen_k, *c.window_size, device=res["q"].device)
    if c.causal:
        allowed &= R.causal_mask(c.seqlen_q, c.seqlen_k, device=res["q"].device)
    rows = allowed.sum(1) == 1
    assert rows.any()
    key = allowed.int().argmax(1)[rows]
    grp = c.hq // c.hkv
    want = res["v"][:, key].repeat_interleave(grp, dim=2)
    got = res["o"][:, rows]
    assert torch.equal(got, want), (got.float() - want.float()).abs().max().item()
    # LSE = the row's one logit: FP32 exact for softmax; softcap's tanh.approx.f32 (relative
    # error 2^-11 on t = tanh(x / c)) moves the logit by up to ~7e-3
    _, lse_ref = R.attention_ref(res["q"], res["k"], res["v"], c.mode, **c.kwargs())
    tol = 1e-2 if c.mode == "softcap" else 1e-4
    assert (res["lse"][:, :, rows].double() - lse_ref[:, :, rows]).abs().max().item() < tol


# ----------------------------------------------------------------------------- rescale threshold
# the online softmax's stale-max threshold (FwdConfig.rescale_threshold): softmax's default is 8
# (the catalogue runs it); the softcap score keeps the online max on FP16 inputs, where the
# threshold is off by default: that case here, then scores that grow towards the first keys,
# which the kernel visits last (key blocks run from the diagonal down): every block raises the
# row max, by more or less than the threshold, so both the kept-max and the rescale branches run
RESCALE_RUNS = [G.run(mid(mode="softcap", evaluator="native", dtype="fp16", head_dim=128, causal=True),
                      overrides={"fwd.rescale_threshold": 8.0}, bwd=False)]
RISING_CASE = cases.pick(1, mode="softmax", dtype="bf16", head_dim=128, causal=True, window=None,
                         where=lambda c: c.seqlen_q >= 640 and c.seqlen_k >= 640 and _tail(c))[0]
RESCALE_RUNS += [G.run(RISING_CASE, overrides={"fwd.rescale_threshold": t}, bwd=False, inputs="rising")
                 for t in (0.0, 2.0, 8.0)]


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(RESCALE_RUNS))
def test_attn_fwd_rescale_threshold(r):
    G.check(r)


RUNS = ODD_RUNS + ROW_SUM_RUNS + FIXED_MAX_RUNS + RANGE_END_RUNS + ONE_KEY_RUNS + RESCALE_RUNS


def run_case(mode, evaluator, dtype, b, s_q, s_k, h_q, h_kv, d, causal, overrides=None, softcap=50.0,
             program=None) -> dict:
    """The forward of the plan for these fields (plan overrides, program) on a contiguous Case
    built from them (seeded by its id), judged by the rule: for the forward files that keep
    their own shape tables (tests/test_attn_fwd_persistent_gpu.py, test_attn_fwd_knobs_gpu.py).
    Returns the checks."""
    c = cases.Case(cases.Variant(mode, evaluator, dtype, d, causal, None), b, s_q, s_k, h_q, h_kv,
                   softcap=softcap if mode == "softcap" else None)
    return G.check(G.run(c, overrides=overrides, program=program, bwd=False))["checks"]


# ----------------------------------------------------------------------------- timing (script)
def time_main_shape(modes, b=1, s=4096, h_q=32, h_kv=8, d=128, reps=30):
    from flash_attn_poly import testing
    from flash_attn_poly.kernels import dispatch

    g = torch.Generator(device="cuda").manual_seed(cases.stable_seed("time_main_shape"))
    q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=g).to(torch.bfloat16) for h in (h_q, h_kv, h_kv))
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
    if "--time" not in argv:
        print("usage: python tests/test_attn_fwd_gpu.py --time   (the tests: pytest -m gpu this file)")
        return 2
    modes = [("softmax", "native", {"fwd.pingpong": False}),
             ("softmax", "native"), ("softcap", "native"), ("softcap", "poly"),
             ("sigmoid", "native"), ("sigmoid", "poly"),
             ("softcap", "native", {"fwd.pingpong": False}), ("sigmoid", "poly", {"fwd.pingpong": False})]
    print(f"{'B=1 S=4096 Hq=32 Hkv=8 D=128 causal bf16':44s} {'ms':>7s} {'TFLOP/s':>8s}")
    for name, ms, tf in time_main_shape(modes):
        print(f"{name:44s} {ms:7.3f} {tf:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
