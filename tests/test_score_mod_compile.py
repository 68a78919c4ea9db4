"""User score functions compile into the forward and backward kernels (sm_90a, on the CPU): the
documented examples build without spills, the polynomial tanh leaves MUFU.TANH out, and a
score_mod that returns the wrong thing fails while tracing with its name in the message."""
import pytest

from flash_attn_poly import plan, score_mod as sm
from flash_attn_poly.kernels import attn_bwd_sm90 as B, attn_fwd_sm90 as F, sass

pytestmark = pytest.mark.compile


def _plan(mod, aux=(), d=128):
    call = plan.AttnCall(mode="softmax", evaluator="native", dtype="bf16", head_dim=d, batch=1, seqlen_q=4096,
                         seqlen_k=4096, heads_q=32, heads_kv=8, causal=True, window=(-1, -1),
                         softmax_scale=d ** -0.5, score_mod=mod, aux=aux)
    return plan.resolve(call, 132)


def _counts(kernel, args):
    return sass.count_opcodes(sass.sass_of(kernel, *args, F.cute.runtime.make_fake_stream()))


EXAMPLES = {
    "alibi": (sm.alibi, (("float32", 1),)),
    "softcap": (lambda: sm.softcap(30.0), ()),
    "softcap_poly": (lambda: sm.softcap(30.0, program="tanh_d4"), ()),
}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_build_forward_and_backward(name):
    make, aux = EXAMPLES[name]
    p = _plan(make(), aux)
    assert p.fwd.score.kind == "user" and p.bwd.score.kind == "user"
    fwd = _counts(F.kernel_for(p.fwd), F._fake_args(p.fwd))
    bwd = _counts(B.kernel_for(p.bwd), B.fake_args(p.bwd))
    for c in (fwd, bwd):
        assert c["HGMMA"] > 0 and c["STL"] == 0, c
    if name == "softcap":
        assert fwd["MUFU.TANH"] > 0 and bwd["MUFU.TANH"] > 0
    if name == "softcap_poly":   # tanh by the packed program on the FMA pipe
        assert fwd["MUFU.TANH"] == 0 and bwd["MUFU.TANH"] == 0
        assert fwd["HFMA2"] > 0 and bwd["HFMA2"] > 0
    if name == "alibi":   # a bias: no transcendental beyond the softmax's exp2
        assert fwd["MUFU.TANH"] == 0


def test_a_score_mod_that_returns_the_wrong_type_names_itself():
    def broken(scores, batch_idx, head_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        return 1.0

    p = _plan(sm.ScoreMod(broken, name="broken_mod"))
    with pytest.raises(Exception, match="broken_mod"):
        F.compile_attn_fwd(p.fwd)
