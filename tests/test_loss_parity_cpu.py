"""CPU tier of bench/loss_parity.py: the corpus split, the token-space EWM and the gaps, and a dry
run (tiny models, reference backend, 20 steps) of one pair plus the noise run, collected again."""
import json
import math
import os
import sys
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import loss_parity as lp  # noqa: E402


def test_corpus_is_deterministic_and_held_out_by_path():
    a, b = lp.build_corpus(max_bytes=300_000), lp.build_corpus(max_bytes=300_000)
    assert a["sha256"] == b["sha256"] and torch.equal(a["train"], b["train"])
    assert a["train"].dtype == torch.uint8 and a["train"].numel() + a["heldout"].numel() == a["bytes"]
    files = lp.stdlib_files()
    assert files == sorted(files) and not any("site-packages" in f for f in files)
    held = [f for f in files if lp.held_out(f)]
    assert 0.005 < len(held) / len(files) < 0.05
    w = lp.windows(a["train"], 63)
    assert w.shape[1] == 64 and torch.equal(w[1, :], a["train"][64:128])


def test_ewm_in_token_space_and_gaps():
    # after one half-life of tokens a step from 1 to 0 is half forgotten, whatever the step size
    for tok in (1, 4):
        ys = lp.ewm([1.0] + [0.0] * (64 // tok), tok, 64.0)
        assert abs(ys[-1] - 0.5) < 1e-12
    nat = {"run": "n", "tokens_per_step": 2, "losses": [3.0] * 50}
    pol = {"run": "p", "tokens_per_step": 2, "losses": [3.0] * 4 + [5.0] + [3.0] * 45}
    g = lp.gap(nat, pol, 4.0)
    assert g["final_gap"] > 0 and g["max_gap"] == pytest.approx(max(abs(x) for x in g["gap_curve"][5:]))
    assert g["steps"] == 50 and g["tokens"] == 100
    with pytest.raises(ValueError, match="differ in tokens per step"):
        lp.gap(nat, {**pol, "tokens_per_step": 4}, 4.0)


def test_seed_spread_judges_a_pair_against_every_native_seed():
    """With >= 3 native seeds of a model, collect() takes the largest pairwise gaps among them as the
    pair's noise (not B2_native vs noise_seed1 alone) and says whether the poly run ends inside
    the seeds' range; with two it keeps the one pair's gap."""
    def run(name, level, bump=0.0):
        fam, score = lp.RUNS[name][:2]
        losses = [level + 2.0 * 0.9 ** i for i in range(200)]
        losses[120] += bump
        return {"run": name, "family": fam, "score": score, "tokens_per_step": 8, "losses": losses,
                "heldout": level, "corpus": {"sha256": "x"}}
    runs = {n: run(n, lv) for n, lv in (("B2_native", 1.000), ("noise_seed1", 1.001), ("noise_seed2", 0.996),
                                          ("noise_seed3", 1.003))}
    runs["B2_poly"] = run("B2_poly", 1.002)
    out = lp.collect(runs, 16.0)
    sp = out["seed_spread"]["gemma2/softcap"]
    assert sp["runs"] == ["B2_native", "noise_seed1", "noise_seed2", "noise_seed3"]
    assert sp["final_gap"] == pytest.approx(0.007) and sp["final_ewm"] == pytest.approx([0.996, 1.003], abs=1e-6)
    arm = out["arms"]["B2"]
    assert arm["noise_from"] == "gemma2/softcap, 4 seeds"
    # +0.002 is outside the one pair's 0.001 but inside the seeds' 0.007 spread
    assert arm["within_noise"] is True and arm["inside_seed_range"] is True
    runs["B2_poly"] = run("B2_poly", 1.010)
    arm = lp.collect(runs, 16.0)["arms"]["B2"]
    assert arm["within_noise"] is False and arm["inside_seed_range"] is False
    for n in ("noise_seed2", "noise_seed3"):
        del runs[n]
    out = lp.collect(runs, 16.0)
    assert out["seed_spread"] == {} and out["arms"]["B2"]["noise_from"] == "gemma2/softcap"
    assert "inside_seed_range" not in out["arms"]["B2"]
    assert out["arms"]["B2"]["within_noise"] is False


def test_seed_spread_of_the_4000_step_pairs():
    """The 4,000-step B1 / B3 pairs are judged against their own length's three native seeds."""
    def run(name, level):
        fam, score = lp.RUNS[name][:2]
        return {"run": name, "family": fam, "score": score, "tokens_per_step": 8,
                "losses": [level + 2.0 * 0.9 ** i for i in range(200)], "heldout": level, "corpus": {"sha256": "x"}}
    for kind, pair, nat, pol, seeds in (
            ("sigmoid", "B3_4k", "B3_native_4k", "B3_poly_4k", ("noise_sigmoid_seed1_4k", "noise_sigmoid_seed2_4k")),
            ("softmax", "B1_4k", "B1_native_4k", "B1_poly_4k", ("noise_llama_seed1_4k", "noise_llama_seed2_4k"))):
        assert all(lp.run_steps(n, SimpleNamespace(dry_run=False, steps=2000)) == 4000 for n in (nat, pol) + seeds)
        runs = {nat: run(nat, 1.000), seeds[0]: run(seeds[0], 1.0005), seeds[1]: run(seeds[1], 0.995),
                pol: run(pol, 1.003)}
        out = lp.collect(runs, 16.0)
        sp = out["seed_spread"][f"llama/{kind}"]
        assert sp["runs"] == [nat, *seeds] and sp["final_gap"] == pytest.approx(0.0055)
        arm = out["arms"][pair]
        assert arm["noise_from"] == f"llama/{kind}, 3 seeds"
        assert arm["within_noise"] is True and arm["inside_seed_range"] is False


def test_dry_run_pair_and_noise_then_collect(tmp_path):
    runs, js = tmp_path / "runs", tmp_path / "lp.json"
    assert lp.main(["--dry-run", "--runs", "B2_native,B2_poly,noise_seed1", "--out-dir", str(runs),
                    "--json", str(js)]) == 0
    out = json.loads(js.read_text())
    assert set(out["arms"]) == {"B2"} and out["noise_gap"] > 0     # another seed: another curve
    arm = out["arms"]["B2"]
    # the reference backend runs the exact functions for both evaluators: no gap at all
    assert arm["final_gap"] == 0 and arm["max_gap"] == 0 and arm["within_noise"] is True
    assert math.isfinite(arm["heldout_native"]) and arm["heldout_native"] < math.log(256)
    assert (tmp_path / "lp.png").stat().st_size > 1000
    r = json.loads((runs / "run_B2_poly.json").read_text())
    assert r["steps"] == 20 and len(r["losses"]) == 20 and r["losses"][-1] < r["losses"][0]
    assert lp.main(["--collect", str(runs), "--json", str(tmp_path / "again.json")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["arms"] == out["arms"] and again["noise_gap"] == out["noise_gap"]


def test_clamped_sigmoid_takes_the_programs_end_values_on_its_columns():
    # the B3_clamp* runs' attention: on the first `cols` key columns of every 128, P outside the
    # default sigmoid program's input range is the program's value at that end; elsewhere exact
    from transformers import AttentionInterface
    import numpy as np
    from flash_attn_poly.asm import programs
    from flash_attn_poly.fit import runtime
    names = lp.register_clamped()
    prog = programs.entry("sigmoid_attn_n4096_f16")
    p_lo, p_hi = runtime.replay(prog, np.array([prog["params"]["lo"], prog["params"]["hi"]]))
    s, d = 256, 256
    v = torch.eye(s)[None, None]                      # O = P
    q = torch.ones(1, 1, s, d)
    for sign, want in ((-1.0, p_lo), (1.0, p_hi)):
        k = sign * 4.0 * torch.ones(1, 1, s, d)      # scaled score +-64: beyond both ends
        for name, cols in (("clamp8", 8), ("clampall", 128), ("floor8", 8)):
            o, _ = AttentionInterface._global_mapping[names[name]](None, q, k, v, None, scaling=d ** -0.5)
            p = o[0, :, 0, :]                         # (S_q, S_k)
            allowed = torch.ones(s, s).tril().bool()
            on = (torch.arange(s) % 128 < cols)[None, :] & allowed
            if name == "floor8" and sign > 0:         # the floor alone: exact above the range
                on = on & False
            assert torch.allclose(p[on], torch.tensor(float(want)))
            off = allowed & ~on
            exact = torch.sigmoid(torch.tensor(sign * 64.0 - math.log(s)))
            assert off.sum() == 0 or torch.allclose(p[off], exact)
            assert (p[~allowed] == 0).all()


def test_replayed_sigmoid_takes_the_poly_forward_on_its_columns():
    # the B3_poly8 / B3_f16p8 runs' attention: on key columns 0-7 of every 128 the forward's P is
    # the poly kernel's model (tests/poly_reference, side "fwd", rounded to BF16) or the FP16-rounded
    # sigmoid; elsewhere, and the gradient everywhere, the exact sigmoid's
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import poly_reference as PR
    from transformers import AttentionInterface
    names = lp.register_replayed()
    s, d = 256, 64
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(1, 1, s, d, generator=g) * 2.0).requires_grad_()
    k = torch.randn(1, 1, s, d, generator=g) * 2.0
    v = torch.eye(s)[None, None]                     # O = P
    scale = d ** -0.5
    x = (q.detach() @ k.transpose(-1, -2)).float() * scale
    b = -math.log(s)
    exact = torch.sigmoid(x + b)
    allowed = torch.ones(s, s).tril().bool()
    on = (torch.arange(s) % 128 < 8)[None, :].expand(s, s) & allowed
    model, _ = PR.sigmoid_fns(b, program="sigmoid_attn_n4096_f16")   # the forward's P (BF16)
    want = {"poly8": model(x)[0, 0].float(), "f16p8": exact[0, 0].half().float()}
    for name in ("poly8", "f16p8"):
        o, _ = AttentionInterface._global_mapping[names[name]](None, q, k, v, None, scaling=scale)
        p = o[0, :, 0, :].bfloat16().float()          # (S_q, S_k): the PV operand is BF16 in training
        assert torch.equal(p[on], want[name][on].bfloat16().float()), name
        off = allowed & ~on
        assert torch.equal(p[off], exact[0, 0][off].bfloat16().float()), name
        assert not torch.equal(p[on], exact[0, 0][on].bfloat16().float()), name   # the columns differ
        # the gradient is the exact sigmoid's: the same as the plain eager attention's
        gq, = torch.autograd.grad(o.float().sum(), q)
        o2, _ = lp.tm.sigmoid_eager(q, k, v, scale)
        gq2, = torch.autograd.grad(o2.float().sum(), q)
        assert torch.allclose(gq, gq2, rtol=0, atol=0), name
