"""CPU smoke of bench/tools/train_sanity.py: --tiny, reference backend, 2 steps, all CPU arms."""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "tools"))
import train_sanity as ts  # noqa: E402


def test_tiny_run_writes_json_and_md(tmp_path):
    js, md = tmp_path / "t.json", tmp_path / "t.md"
    assert ts.main(["--tiny", "--backend", "reference", "--json", str(js), "--md", str(md)]) == 0
    out = json.loads(js.read_text())
    arms = {r["arm"]: r for r in out["results"]}
    assert set(arms) == {"softmax_native", "softcap_native", "softcap_poly", "sigmoid_native",
                         "sigmoid_poly"}                      # swiglu_poly needs CUDA
    for r in arms.values():
        assert r["steps"] == 2 and math.isfinite(r["final_ema"])
    assert "max_abs_gap" in arms["softcap_poly"] and "max_abs_gap" in arms["sigmoid_poly"]
    assert "| softcap_poly |" in md.read_text()
    assert ts.main(["--from-json", str(js), "--md", str(tmp_path / "r.md")]) == 0


def test_data_is_deterministic_and_learnable():
    p, floor = ts.markov_chain(64, 0)
    assert floor < math.log(64) - 1.0
    a, b = ts.make_batches(p, 2, 2, 16, 0), ts.make_batches(p, 2, 2, 16, 0)
    assert a.equal(b)
