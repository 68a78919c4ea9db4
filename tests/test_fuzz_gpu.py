"""GPU tier: 300 random configurations (tests/cases.py fuzz_cases), forward and backward by the
FlashAttention rule (tests/rule_harness.py), like the catalogue.

The draws: numpy Generator(FAP_FUZZ_SEED, default cases.FUZZ_SEED) picks B, S_q, S_k (1 and
tiny lengths often), H_q / H_kv, the variant (mode, evaluator, dtype, head_dim, causal, window
sides) from the catalogue's, window sizes, the softcap in [5, 50], and the layout (contiguous,
one packed projection, transposed storage, a padded head stride: 16-byte aligned or not).  A draw
whose resolved kernel builds the catalogue does not have is redrawn, so this tier compiles
nothing new.  Each id starts with fuzz<seed>_<index> and spells out the whole draw; rerun one
with `FAP_FUZZ_SEED=<seed> pytest -m gpu tests/test_fuzz_gpu.py -k <index-and-shape>`.

FAP_SHARD and FAP_CORRECTNESS_OUT as in tests/test_correctness_gpu.py (records go to
DIR/fuzz-shard<i>of<n>.jsonl); the same variant-to-shard map, so a shard that ran its catalogue
part in the same process reuses its compiled kernels.
"""
import pytest

torch = pytest.importorskip("torch")

import cases  # noqa: E402
import rule_harness as H  # noqa: E402


def _sm_count() -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).multi_processor_count
    return cases.SM_COUNT_DEFAULT


SEED = cases.fuzz_seed()
CASES = cases.select_shard(cases.fuzz_cases(SEED, sm_count=_sm_count()))
_record = H.recorder_for("fuzz")


@pytest.fixture(scope="module", autouse=True)
def _print_seed(request):
    """The seed on the terminal even under -q and output capture: it reproduces every draw."""
    capman = request.config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled():
        print(f"\nfuzz tier: FAP_FUZZ_SEED={SEED}, {len(CASES)} of {cases.FUZZ_COUNT} cases in this shard")
    yield


@pytest.mark.gpu
@pytest.mark.parametrize("case", cases.params(CASES))
def test_fuzz_case(case):
    H.check(case, "cuda", _record)
