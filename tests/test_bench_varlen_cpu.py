"""CPU tier: bench/varlen.py's host side (the length draws, the rows, the ratios)."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import varlen as bv  # noqa: E402


def test_ragged_lengths_fill_the_budget_with_a_long_tail():
    lens = bv.ragged_lengths(32768, seed=0)
    assert sum(lens) == 32768 and min(lens) >= 1 and max(lens) <= 16384
    assert lens == bv.ragged_lengths(32768, seed=0) != bv.ragged_lengths(32768, seed=1)
    med = sorted(lens)[len(lens) // 2]
    assert max(lens) > 3 * med   # long-tailed


def test_rows_and_ratios():
    rows = bv.rows_for("ragged", ["softmax", "sigmoid"], ["poly", "native"])
    assert ("fa4_varlen", "softmax", "native") in rows and not any(r[0] == "fa4_varlen" and r[1] == "sigmoid" for r in rows)
    assert ("ours_varlen", "sigmoid", "poly") in rows and ("ours_padded", "softmax", "native") in rows
    assert {r[0] for r in bv.rows_for("equal", ["softmax"], ["poly"])} == {"ours_varlen", "ours_varlen_nocheck",
                                                                           "ours_dense"}
    # sigmoid at its default bias runs on the varlen kernels (each sequence's -ln S_k): every row, knobs too
    assert ("ours_varlen_nocheck", "sigmoid", "poly") in rows
    knob_rows = bv.rows_for("ragged", ["softmax", "sigmoid"], ["poly"], knob=True, bknob=True)
    for impl in ("ours_varlen_knob", "ours_varlen_bknob"):
        assert (impl, "softmax", "poly") in knob_rows and (impl, "sigmoid", "poly") in knob_rows
    assert bv.parse_knob("o_smem=1+num_stages=3") == {"fwd.o_smem": True, "fwd.num_stages": 3}
    assert bv.parse_knob("dq_halves=1+head_loop=0", "bwd") == {"bwd.dq_halves": True, "bwd.head_loop": False}
    with pytest.raises(ValueError, match="o_smem"):
        bv.parse_knob("o_smem")
    with pytest.raises(ValueError, match="unknown"):
        bv.parse_knob("o_smem=1", "bwd")
    res = [{"impl": "ours_varlen", "mode": "softmax", "evaluator": "poly", "fwd_ms": 1.0, "bwd_ms": 2.0},
           {"impl": "fa4_varlen", "mode": "softmax", "evaluator": "native", "fwd_ms": 1.5, "bwd_ms": 3.0},
           {"impl": "ours_padded", "mode": "softmax", "evaluator": "poly", "fwd_ms": 4.0, "bwd_ms": None},
           {"impl": "ours_varlen_nocheck", "mode": "softmax", "evaluator": "poly", "fwd_ms": 0.9, "bwd_ms": 2.0},
           {"impl": "ours_varlen_knob", "mode": "softmax", "evaluator": "poly", "fwd_ms": 0.8, "bwd_ms": None},
           {"impl": "ours_varlen_bknob", "mode": "softmax", "evaluator": "poly", "fwd_ms": None, "bwd_ms": 1.6}]
    r = bv.ratios(res, "ragged")
    assert r == {"fa4_varlen/softmax/poly/fwd": 1.5, "fa4_varlen/softmax/poly/bwd": 1.5,
                 "ours_padded/softmax/poly/fwd": 4.0, "knob:fa4_varlen/softmax/poly/fwd": 1.5 / 0.8,
                 "knob:ours_padded/softmax/poly/fwd": 4.0 / 0.8, "knob:ours_varlen_nocheck/softmax/poly/fwd": 0.9 / 0.8,
                 "bknob:fa4_varlen/softmax/poly/bwd": 3.0 / 1.6, "bknob:ours_varlen_nocheck/softmax/poly/bwd": 2.0 / 1.6,
                 "nocheck:fa4_varlen/softmax/poly/fwd": 1.5 / 0.9, "nocheck:fa4_varlen/softmax/poly/bwd": 1.5,
                 "nocheck:ours_padded/softmax/poly/fwd": 4.0 / 0.9, "nocheck:ours_varlen/softmax/poly/fwd": 1.0 / 0.9,
                 "nocheck:ours_varlen/softmax/poly/bwd": 1.0}
    assert bv.causal_flops([2, 4], 1, 1, False) == 4 * (4 + 16) / 2


def test_list_runs_without_a_gpu(capsys):
    bv.main(["--list", "--scenario", "equal", "--modes", "softcap"])
    out = capsys.readouterr().out
    assert "8 sequences, 32768 tokens" in out and "ours_dense/softcap/poly" in out


def test_bwd_knob_lists_its_row_and_refuses_a_forward_field(capsys):
    bv.main(["--list", "--scenario", "ragged", "--modes", "softmax,sigmoid", "--evaluators", "native",
             "--bwd-knob", "dq_halves=1"])
    out = capsys.readouterr().out
    assert "ours_varlen_bknob/softmax/native" in out and "ours_varlen_bknob/sigmoid/native" in out
    bv.main(["--list", "--scenario", "ragged", "--modes", "softmax", "--fwd-only", "--bwd-knob", "dq_halves=1"])
    assert "bknob" not in capsys.readouterr().out     # --fwd-only times no backward row
    with pytest.raises(ValueError, match="o_smem"):
        bv.main(["--list", "--bwd-knob", "o_smem=1"])
