"""GPU tier of sliding windows (window_size=(left, right)): what the catalogue does not run.

The catalogue (tests/test_correctness_gpu.py) runs seven window variants at their default plans
(two-sided, left-only with and without causal, right-only; softmax, softcap native and poly (the
exp2 offload, which runs in mask-free blocks only), sigmoid poly; BF16 and FP16; D 64/128) with
flash-attn's random window sizes, so tiles are skipped on both sides, rows see no key, and (0, 0)
leaves the diagonal.  This file runs, on catalogue window cases (tests/cases.py) and judged by the
one rule (tests/gpu_check.py, forward then backward, against the FP64 reference of the function
the plan computes): the FP16 tanh program (a poly score: BF16 softcap's default is the exp2
offload), the native sigmoid, and the head_loop backward over GQA groups, under windows.

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_window_gpu.py        (the H200)
    FAP_TEST_BACKEND=reference python -m pytest -q -m gpu tests/test_window_gpu.py  (CPU dry run)
"""
import pytest

torch = pytest.importorskip("torch")

import cases  # noqa: E402
import gpu_check as G  # noqa: E402

HONORS_TEST_BACKEND = True   # tests/conftest.py: FAP_TEST_BACKEND=reference runs these on the CPU

SMALL = 600_000   # B x H_q x S_q x S_k of a mechanism case: its FP64 references take ~0.1 s
TANH_PROGRAM = "softcap_c50_f16_odd"


def windowed(n, **attrs):
    """n mid-size catalogue cases of a window variant whose window bounds a side below S_k."""
    def cut(c):
        left, right = c.window_size
        return c.seqlen_q >= 64 and c.seqlen_k >= 128 and (0 <= left < c.seqlen_k or 0 <= right < c.seqlen_k)
    return cases.pick(n, where=cut, max_size=SMALL, **attrs)


SOFTCAP_POLY_BOTH = windowed(2, mode="softcap", evaluator="poly", window="both")
SOFTMAX_CAUSAL_LEFT = windowed(1, mode="softmax", window="left", causal=True)
SIGMOID_POLY_BOTH = windowed(1, mode="sigmoid", evaluator="poly", window="both")

# the FP16 tanh program under two-sided windows (GQA 4 and 8), forward and backward
TANH_RUNS = [G.run(c, program=TANH_PROGRAM) for c in SOFTCAP_POLY_BOTH]
# the native sigmoid (the catalogue's windowed sigmoid is poly): two-sided, and causal left-only
SIGMOID_NATIVE_RUNS = [G.run(cases.retarget(SIGMOID_POLY_BOTH[0], evaluator="native")),
                       G.run(cases.retarget(SOFTMAX_CAUSAL_LEFT[0], mode="sigmoid"))]
# head_loop (a CTA per KV head over its GQA group) where the plan picks the other build: GQA
# window cases; the windowed sigmoid case with its heads grouped 8 over 2 (a runtime value)
HEAD_LOOP_RUNS = [G.run(c, overrides={"bwd.head_loop": True}, fwd=False, program=p)
                  for c, p in ((SOFTMAX_CAUSAL_LEFT[0], None), (SOFTCAP_POLY_BOTH[0], None),
                               (SOFTCAP_POLY_BOTH[0], TANH_PROGRAM),
                               (cases.retarget(SIGMOID_POLY_BOTH[0], hq=8, hkv=2), None))]
RUNS = TANH_RUNS + SIGMOID_NATIVE_RUNS + HEAD_LOOP_RUNS


@pytest.mark.gpu
@pytest.mark.parametrize("r", G.params(RUNS))
def test_window_fwd_bwd(r):
    G.check(r)


def test_catalogue_windowed_softcap_poly_runs_the_exp2_offload():
    """The catalogue's windowed softcap/poly cases run attention()'s BF16 default, the exp2
    offload (2^a on the FMA pipe in mask-free blocks, MUFU where a window or causal mask cuts a
    block): the plan says so (the catalogue's GPU run then checks them by the rule)."""
    picked = cases.pick(mode="softcap", evaluator="poly", dtype="bf16", where=lambda c: c.variant.window is not None)
    assert picked
    for c in picked:
        p = G.run(c).plan()
        assert p.fwd.exp2_fma > 0 and p.score.program.is_exp2, (c.id, p.fwd)
