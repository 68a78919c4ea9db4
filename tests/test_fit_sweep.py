"""The degree sweeps (seed figures 4/5, bench/results/sweeps.json): the committed numbers replay,
the committed D4 (and sigmoid D3) programs are the sweep's own picks, and the seed's claim is
checked per sweep.  CPU, seconds: the replays use the stored programs, no search."""
import json
from pathlib import Path

import numpy as np
import pytest

from flash_attn_poly.asm.programs import load_table
from flash_attn_poly.fit import runtime as rt
from flash_attn_poly.fit import sweep as SW
from flash_attn_poly.fit.search import grid

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results" / "sweeps.json"
# the table entry each sweep's D4 row (sigmoid: also D3) must equal
DEPLOYED = {"sigmoid": {3: "sigmoid_d3", 4: "sigmoid_d4"}, "tanh": {4: "tanh_d4"}, "silu": {4: "silu_d4"},
            "gelu": {4: "gelu_d4"}, "sigmoid_grad": {4: "sigmoid_d4_grad"},
            "tanh_grad": {4: "tanh_d4_grad_direct"}, "silu_grad": {4: "silu_d4_grad"},
            "gelu_grad": {4: "gelu_d4_grad"}}


@pytest.fixture(scope="module")
def data():
    return json.loads(RESULTS.read_text())


def test_sweeps_cover_every_function_direction_and_degree(data):
    assert [s["key"] for s in data["sweeps"]] == list(SW.KEYS)
    assert all([r["degree"] for r in s["rows"]] == [3, 4, 5, 6] for s in data["sweeps"])
    assert data["inputs"] == len(SW.sweep_inputs("bf16")) == 33409


def test_committed_max_errors_replay(data):
    """Every number behind the figures, recomputed from the stored coefficients."""
    x = SW.sweep_inputs("bf16")
    for s in data["sweeps"]:
        for r in s["rows"]:
            p = SW.program_of(r, s["key"], "bf16")
            assert rt.to_bits(np.array(p["coeffs"]), "bf16").tolist() == [int(b, 16) for b in r["coeffs_bits"]]
            e = SW.max_errors(p, s["key"], x)
            assert e["fused"] == pytest.approx(r["max_fused"], rel=1e-12), (s["key"], r["degree"])
        assert s["output_floor"] == pytest.approx(SW.output_floor(s["key"], x), rel=1e-12)
        assert all(r["max_fused"] >= s["output_floor"] for r in s["rows"])


def test_the_seed_claim_per_sweep(data):
    """'At least one higher-degree program has greater max error than a lower-degree one after
    BF16 replay': holds for sigmoid, tanh and every derivative; fails for the SiLU and GELU
    values, whose max error falls (GELU) or stays level (SiLU D5 = D6) with the degree."""
    got = {}
    for s in data["sweeps"]:
        errs = {r["degree"]: r["max_fused"] for r in s["rows"]}
        pairs = SW.claim(errs)
        assert [tuple(p) for p in s["claim_pairs"]] == pairs and s["claim_holds"] == bool(pairs)
        got[s["key"]] = bool(pairs)
    assert got == {k: k not in ("silu", "gelu") for k in SW.KEYS}
    by = {s["key"]: {r["degree"]: r["max_fused"] for r in s["rows"]} for s in data["sweeps"]}
    assert by["tanh_grad"][6] > 3 * by["tanh_grad"][4]      # D6 tanh': 9.2e-2 vs D4 2.8e-2
    assert by["sigmoid"][5] > by["sigmoid"][4]              # 6.9e-3 vs 6.3e-3
    assert by["silu"][5] == by["silu"][6]


def test_sweep_picks_are_the_deployed_programs(data):
    table = load_table()["programs"]
    for s in data["sweeps"]:
        for r in s["rows"]:
            name = DEPLOYED[s["key"]].get(r["degree"])
            if name:
                p = table[name]
                assert (r["coeffs"], r["L_i"], r["L_c"]) == (p["coeffs"], p["L_i"], p["L_c"]), name


def test_selection_on_a_reduced_grid_reproduces_the_committed_rows(data):
    """The search path behind the sweep (select) on a grid around the committed tanh picks."""
    rows = {r["degree"]: r for r in next(s for s in data["sweeps"] if s["key"] == "tanh")["rows"]}
    got = SW.select("tanh", degrees=(3, 4), grids={"tanh": (grid(2.75, 3.25), grid(2.5, 3.0))})
    for d in (3, 4):
        assert (got[d]["coeffs"], got[d]["L_i"], got[d]["L_c"]) == \
            (rows[d]["coeffs"], rows[d]["L_i"], rows[d]["L_c"]), d
