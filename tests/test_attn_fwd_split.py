"""Poly split (score_stages.poly_split): CPU unit tests, the split reference, and the one-call
device driver that compiles and times the split x loop-schedule variants.

Device run (one call; compiles in parallel processes, then times one process at a time):
    python tests/test_attn_fwd_split.py --out $OUT
Each worker: compile, correctness on a small GQA case against the per-column reference
(poly columns: the program replay; MUFU columns: the exact function), then, after every
worker has compiled (so CPU load cannot delay launches), time B=1 S=4096 Hq=32 Hkv=8 D=128
causal BF16 under a file lock: 5 warm-ups, 25 rounds of 10 back-to-back launches between
CUDA events, median per-call time.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import subprocess
import sys
import tempfile
import time

try:
    import pytest
except ImportError:  # the device machine may lack pytest: the driver below does not need it
    pytest = None

# (name, mode, evaluator, poly_split, tuning): AttnFwdConfig overrides on top of the default
# config; "pp" = ping-pong on, "no pp" = off, "s3" = 3 K/V pipeline stages (224 KB smem)
VARIANTS = [
    ("softmax no pp", "softmax", "native", None, {"pingpong": False}),
    ("softmax pp", "softmax", "native", None, {"pingpong": True}),
    ("softcap native no pp", "softcap", "native", None, {"pingpong": False}),
    ("softcap native pp", "softcap", "native", None, {"pingpong": True}),
    ("softcap poly 1/2 no pp", "softcap", "poly", (1, 2), {"pingpong": False}),
    ("softcap poly 1/2 pp", "softcap", "poly", (1, 2), {"pingpong": True}),
    ("softcap poly 1/4 no pp", "softcap", "poly", (1, 4), {"pingpong": False}),
    ("softcap poly 1/4 pp", "softcap", "poly", (1, 4), {"pingpong": True}),
    ("sigmoid native no pp", "sigmoid", "native", None, {"pingpong": False}),
    ("sigmoid native pp", "sigmoid", "native", None, {"pingpong": True}),
    ("sigmoid poly 1/4 no pp", "sigmoid", "poly", (1, 4), {"pingpong": False}),
    ("sigmoid poly 1/4 pp", "sigmoid", "poly", (1, 4), {"pingpong": True}),
    ("sigmoid poly 1/2 no pp", "sigmoid", "poly", (1, 2), {"pingpong": False}),
    ("softmax no pp s3", "softmax", "native", None, {"pingpong": False, "num_stages": 3}),
    ("softcap native no pp s3", "softcap", "native", None, {"pingpong": False, "num_stages": 3}),
    ("sigmoid native no pp s3", "sigmoid", "native", None, {"pingpong": False, "num_stages": 3}),
    ("softcap poly 1/2 pp s3", "softcap", "poly", (1, 2), {"pingpong": True, "num_stages": 3}),
    ("sigmoid poly 1/4 pp s3", "sigmoid", "poly", (1, 4), {"pingpong": True, "num_stages": 3}),
]


def _stages():
    from flash_attn_poly.kernels import score_stages as S
    return S


# ------------------------------------------------------------------------------ CPU tests
def test_softcap_clamp_from_table():
    S = _stages()
    from flash_attn_poly.asm import programs
    for prog in ("softcap_c50", "softcap_c50_f16", None):   # None: the default program
        L_c = programs.entry(prog or S.DEFAULT_PROGRAM["softcap"])["L_c"]
        kw = {"program": prog} if prog else {}
        assert S.make_stage("softcap", "poly", **kw).clamp_l == L_c
    with pytest.raises(TypeError):
        S.SoftcapStage(evaluator="poly", clamp_l=3.25)   # no second source of truth


def test_split_rule():
    S = _stages()
    st = S.make_stage("sigmoid", "poly", poly_split=(1, 4))
    assert [st.poly_pair(g) for g in range(8)] == [True, False, False, False] * 2
    assert not S.make_stage("sigmoid", "native").poly_pair(0)
    with pytest.raises(ValueError):
        S.make_stage("softcap", "poly", poly_split=(1, 3))


@pytest.mark.parametrize("mode", ["softcap", "sigmoid"])
@pytest.mark.parametrize("d,tuning", [(64, ()), (128, ()), (256, ()), (128, (("tile_n", 64),))])
def test_forward_split_is_the_backward_rule(mode, d, tuning):
    """The forward decides block or MUFU per column group g of its key block (compile time);
    the backward per global key group (key // 8).  For the stage attn_fwd builds by default
    (any head dim, or tile_n 64 as a knob) the two agree on every key of several blocks, and
    attn_bwd's default split is that stage's (D = 256: 1/8, the 64-key block's finest)."""
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels import attn_bwd_sm90 as B, attn_fwd_sm90 as A
    S = _stages()
    items = dict(tuning, **A._fixed_max_kw(mode, "bf16", 50.0, dict(tuning)))   # as attn_fwd resolves it
    stage, cfg = A._stage_and_config(mode, "poly", "bf16", d, True, tuple(sorted(items.items())))
    A.AttnFwdSm90(cfg)   # accepted
    j, k = stage.poly_split
    assert 0 < j < k
    for key in range(4 * cfg.tile_n):
        assert stage.poly_pair((key % cfg.tile_n) // 8) == S.poly_pair(stage.poly_split, key // 8), key
    if not tuning:
        assert B.default_split(mode, "poly", d) == stage.poly_split
    assert stage.poly_split == ((1, 16) if (mode, cfg.tile_n) == ("sigmoid", 128) else (1, 8))
    # softcap at D = 128: the three-warpgroup tile 192 x 64 unless a tuning sets the tile
    assert (cfg.tile_m, cfg.tile_n) == ((192, 64) if (mode, d, tuning) == ("softcap", 128, ()) else
                                        (128, S.default_key_block(d) if not tuning else 64))


def test_forward_refuses_a_split_longer_than_its_key_block():
    """1/16 repeats every 128 keys: a 64-key forward block cannot apply it at compile time
    (it would send group 0 of every block through the polynomial, the backward only that of
    even blocks), so the config is refused, naming the limit; 1/8, all and none are fine."""
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels import attn_fwd_sm90 as A
    S = _stages()
    bad = S.make_stage("softcap", "poly", poly_split=(1, 16))
    with pytest.raises(ValueError, match=r"repeats every 128 keys.*tile_n 64.*k <= 8"):
        A.AttnFwdSm90(A.AttnFwdConfig.default(bad, "bf16", 256, True))
    with pytest.raises(ValueError, match="repeats every 128 keys"):
        A.AttnFwdSm90(A.AttnFwdConfig.default(bad, "bf16", 128, True, tile_n=64))
    for split in [(1, 8), (1, 1), (0, 16), (16, 16)]:
        A.AttnFwdSm90(A.AttnFwdConfig.default(S.make_stage("softcap", "poly", poly_split=split), "bf16", 256, True))
    assert S.default_poly_split("sigmoid", 128) == (1, 16) and S.default_poly_split("sigmoid", 64) == (1, 8)
    assert S.make_stage("sigmoid", "poly", key_block=64).poly_split == (1, 8)
    # a caller's 1/16 stage at D = 128 (BF16 softcap: the 64-key three-warpgroup default) runs
    # on the two-warpgroup 128-key tile instead of being refused
    items = tuple(A._fixed_max_kw("softcap", "bf16", 50.0, None).items())
    cfg = A._config_for_stage(bad, "bf16", 128, True, items)
    assert (cfg.tile_m, cfg.tile_n) == (128, 128)
    A.AttnFwdSm90(cfg)
    with pytest.raises(ValueError, match="repeats every 128 keys"):
        A.AttnFwdSm90(A._config_for_stage(bad, "bf16", 256, True, ()))


def test_exp2_fma_block_replay_error():
    """The exp2_f32 block that score_stages.exp2_fma inlines, run by the PTX emulator: bit-exact
    with fit/exp2.replay (the program's FP32 order) and within 7.6e-5 relative of 2^a over the
    fixed-max argument range and the block's limits [-125, 127] (half-integers included: the
    round-to-nearest of the 1.5 * 2^23 add)."""
    import numpy as np
    from flash_attn_poly.asm import blocks as B, emulator as E, programs as PG
    from flash_attn_poly.fit import exp2 as X
    a = np.concatenate([np.linspace(-125, 127, 400001), np.arange(-125, 128) + 0.5]).astype(np.float32)
    (bits,) = E.run_block(B.get_block("exp2_f32"), a)
    got = bits.view(np.float32).astype(np.float64)
    assert np.array_equal(got, X.replay(PG.entry(X.NAME), a.astype(np.float64)))
    rel = np.abs(got / np.exp2(a.astype(np.float64)) - 1)
    assert rel.max() <= 7.6e-5, rel.max()


def test_exp2_program_fit_reproduces_the_table():
    """`python -m flash_attn_poly.fit exp2` rebuilds the committed entry bit for bit."""
    from flash_attn_poly.asm import programs as PG
    from flash_attn_poly.fit import exp2 as X
    assert X.make()["coeffs_bits"] == PG.entry(X.NAME)["coeffs_bits"]


def test_exp2_fma_config_checks():
    """AttnFwdConfig.exp2_fma: 0..8 groups of 8, only under fixed_max (a bounded exp2 argument)."""
    pytest.importorskip("cutlass")
    from flash_attn_poly.kernels import attn_fwd_sm90 as A
    S = _stages()
    st = S.make_stage("softcap", "native")
    A.AttnFwdSm90(A.AttnFwdConfig.default(st, "bf16", 128, True, fixed_max=True, exp2_fma=2))
    for kw in ({"exp2_fma": 2}, {"fixed_max": True, "exp2_fma": 9}, {"fixed_max": True, "exp2_fma": -1}):
        with pytest.raises(ValueError, match="exp2_fma"):
            A.AttnFwdSm90(A.AttnFwdConfig.default(st, "bf16", 128, True, **kw))


def test_frag_a_col_group():
    S = _stages()
    # ((2 cols, 2 rows, 2 groups), M=1, (N/16=8, 1)): element 4 is group 1, element 8 group 2
    shape = ((2, 2, 2), 1, (8, 1))
    assert [S.frag_a_col_group(shape, e) for e in (0, 2, 4, 6, 8, 12, 60)] == [0, 0, 1, 1, 2, 3, 15]


def split_score_fn(mode, stage, s_k, softcap=50.0):
    """Per-key-column reference of a poly stage (poly_reference.split_fns): key columns n
    with stage.poly_pair(n // 8) get the program replay, the others the exact function."""
    import poly_reference as PR
    return PR.split_fns(mode, stage, s_k, softcap)[0]


# ------------------------------------------------------------------------------ device driver
def _check(mode, stage, tuning):
    import torch
    from flash_attn_poly import reference, testing
    from flash_attn_poly.kernels.attn_fwd_sm90 import attn_fwd

    b, s, h_q, h_kv, d = 1, 333, 8, 2, 128
    torch.manual_seed(0)
    q = (torch.randn(b, s, h_q, d, device="cuda") * (8.0 if mode == "softcap" else 1.0)).bfloat16()
    k = torch.randn(b, s, h_kv, d, device="cuda").bfloat16()
    v = torch.randn(b, s, h_kv, d, device="cuda").bfloat16()
    kw = dict(causal=True, softcap=50.0 if mode == "softcap" else None)
    out = testing.poison_(torch.empty_like(q))
    o, _ = attn_fwd(q, k, v, mode=mode, stage=stage, out=out, tuning=tuning, **kw)
    torch.cuda.synchronize()
    exact, _ = reference.attention_ref(q, k, v, mode, **kw)
    fn = split_score_fn(mode, stage, s) if getattr(stage, "evaluator", "") == "poly" else None
    ref, _ = reference.attention_ref(q, k, v, mode, score_fn=fn, **kw)
    low, _ = reference.attention_ref_lowprec(q, k, v, mode, score_fn=fn, **kw)
    st = testing.assert_close_rule(o, ref, low, factor=2.0, floor=1e-3, name="O")
    st["exact_err"] = testing.max_abs_err(o, exact)
    return st


def _time(mode, stage, tuning, reps=25, inner=10):
    import torch
    from flash_attn_poly.kernels import attn_fwd_sm90 as A

    b, s, h_q, h_kv, d = 1, 4096, 32, 8, 128
    q = torch.randn(b, s, h_q, d, device="cuda").bfloat16()
    k = torch.randn(b, s, h_kv, d, device="cuda").bfloat16()
    v = torch.randn(b, s, h_kv, d, device="cuda").bfloat16()
    o = torch.empty_like(q)
    lse = torch.empty(b, h_q, s, device="cuda")
    cfg = A.AttnFwdConfig.default(stage, "bf16", d, True, **tuning)
    params = stage.host_scalars(d ** -0.5, s, softcap=50.0, sigmoid_bias=None)
    args = [q, k, v, o, lse] + [float(x) for x in params] + [0, 0]   # window sizes (unused unwindowed)
    fn = A._compiled(cfg)
    for _ in range(5):
        fn(*args)
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(inner):
            fn(*args)
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / inner)
    return sorted(ts)[len(ts) // 2]


def worker(idx, out_dir, n_workers):
    name, mode, ev, split, tuning = VARIANTS[idx]
    S = _stages()
    from flash_attn_poly.kernels import attn_fwd_sm90 as A
    rec = dict(name=name, mode=mode, evaluator=ev, split=split, tuning=tuning)
    stage = S.make_stage(mode, ev, **({"poly_split": split} if split else {}))
    t0 = time.time()
    try:
        A._compiled(A.AttnFwdConfig.default(stage, "bf16", 128, True, **tuning))
        rec["compile_s"] = round(time.time() - t0, 1)
        print(f"[{name}] compiled {rec['compile_s']}s", flush=True)
    except Exception as e:
        rec["error"] = f"compile: {type(e).__name__}: {str(e)[:300]}"
    open(os.path.join(out_dir, f"ready_{idx}"), "w").close()
    deadline = time.time() + 150   # wait until all workers compiled (CPU quiet), bounded
    while time.time() < deadline and sum(f.startswith("ready_") for f in os.listdir(out_dir)) < n_workers:
        time.sleep(0.5)
    if "error" not in rec:
        with open(os.path.join(out_dir, "gpu.lock"), "w") as lk:
            fcntl.flock(lk, fcntl.LOCK_EX)
            try:
                st = _check(mode, stage, tuning)
                rec.update(err=st["max_abs_err"], lowprec=st["lowprec_err"], exact_err=st["exact_err"], ok=True)
            except Exception as e:
                rec.update(ok=False, check=f"{type(e).__name__}: {str(e)[:300]}")
            try:
                rec["ms"] = _time(mode, stage, tuning)
            except Exception as e:
                rec["error"] = f"time: {type(e).__name__}: {str(e)[:300]}"
            print(f"[{name}] {json.dumps(rec)}", flush=True)
    with open(os.path.join(out_dir, f"result_{idx}.json"), "w") as f:
        json.dump(rec, f)


def main(argv):
    out_dir = argv[argv.index("--out") + 1] if "--out" in argv else "/tmp/split_out"
    if "--worker" in argv:
        if os.environ.get("FAP_SPLIT_ONLY"):   # the parent's --only selection, same order
            keep = os.environ["FAP_SPLIT_ONLY"].split(",")
            VARIANTS[:] = [v for v in VARIANTS if v[0] in keep]
        return worker(int(argv[argv.index("--worker") + 1]), out_dir, int(argv[argv.index("--n") + 1]))
    os.makedirs(out_dir, exist_ok=True)
    final_dir, out_dir = out_dir, tempfile.mkdtemp(prefix="split_")   # $OUT returns few files
    if "--only" in argv:   # comma-separated variant names: run these only (same worker indices)
        keep = argv[argv.index("--only") + 1].split(",")
        unknown = [k for k in keep if k not in [v[0] for v in VARIANTS]]
        assert not unknown, f"unknown variants {unknown}"
        VARIANTS[:] = [v for v in VARIANTS if v[0] in keep]
        os.environ["FAP_SPLIT_ONLY"] = ",".join(keep)
    n = len(VARIANTS)
    procs = []
    for i in range(n):
        log = open(os.path.join(out_dir, f"worker_{i}.log"), "w")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(i), "--n", str(n),
                                       "--out", out_dir], stdout=log, stderr=subprocess.STDOUT))
    for p in procs:
        p.wait()
    rows = []
    for i in range(n):
        path = os.path.join(out_dir, f"result_{i}.json")
        rows.append(json.load(open(path)) if os.path.exists(path) else dict(name=VARIANTS[i][0], error="no result"))
    json.dump(rows, open(os.path.join(final_dir, "split_results.json"), "w"), indent=1)
    with open(os.path.join(final_dir, "workers.log"), "w") as f:
        for i in range(n):
            f.write(open(os.path.join(out_dir, f"worker_{i}.log")).read())
    print(f"\n{'variant':22s} {'ms':>7s} {'err':>9s} {'lowprec':>9s} {'exact':>9s} ok")
    for r in rows:
        print(f"{r['name']:22s} {r.get('ms', float('nan')):7.3f} {r.get('err', float('nan')):9.2e} "
              f"{r.get('lowprec', float('nan')):9.2e} {r.get('exact_err', float('nan')):9.2e} "
              f"{r.get('ok', '-')} {r.get('error', '')}{r.get('check', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
