"""GPU tier: the catalogue (tests/cases.py) forward and backward by the FlashAttention rule.

Every case runs attention() (backend="cuda") on its seeded inputs, O and LSE then dQ/dK/dV
through autograd, each judged by tests/rule_harness.py: max |T - T_FP64| <= 2 x max |T_torch -
T_FP64| + floor, T_torch the same math in torch at the input precision.

    FAP_SHARD=i/n              run shard i of n (cases split by kernel variant: each build
                               compiles in one process); bench/round.sh correctness runs n at once
    FAP_CORRECTNESS_OUT=DIR    append one JSON line per case to DIR/catalogue-shard<i>of<n>.jsonl
                               (bench/correctness.py collect DIR merges them)

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_correctness_gpu.py
"""
import pytest

pytest.importorskip("torch")

import cases  # noqa: E402
import rule_harness as H  # noqa: E402

CASES = cases.select_shard(cases.catalogue())
_record = H.recorder_for("catalogue")


@pytest.mark.gpu
@pytest.mark.parametrize("case", cases.params(CASES))
def test_catalogue_case(case):
    H.check(case, "cuda", _record)
