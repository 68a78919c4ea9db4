"""CPU: the attention-output error diagnostics of fit.attn_metric order as the numerics say."""
import math

import torch

from flash_attn_poly.fit import attn_metric as am
from flash_attn_poly.asm.programs import load_table


_rel = am.rel_l2


def test_sigmoid_floors_order():
    prog = load_table()["programs"]["sigmoid_attn_n4096"]
    q, k, v = am.make_inputs(7, H=1, S=256, spread=1.5)
    outs = am.sigmoid_outputs(prog, q, k, v)
    ref = outs.pop("ref")
    assert set(outs) == set(am.SIGMOID_PATHS)
    err = {p: _rel(o, ref) for p, o in outs.items()}
    assert all(math.isfinite(e) and e > 0 for e in err.values()), err
    # an FP16 input is ~8x finer than BF16: its floor sits near native, BF16's well above
    assert err["f16in"] < 1.3 * err["native"] < err["bf16in"], err
    # the fused program carries the fit error plus BF16 arithmetic: worse than its exact replay
    assert err["poly"] > err["poly_real"] > err["native"], err
    assert isinstance(outs["poly"], torch.Tensor)


def test_sigmoid_f16_program_within_2x_native():
    """The FP16 D4 sigmoid-attention program (table entry sigmoid_attn_n4096_f16, every
    score through it, P rounded to BF16 for PV) stays within 2x the native path's output
    error, where the BF16 D3 program is several times worse."""
    progs = load_table()["programs"]
    f16, b16 = progs["sigmoid_attn_n4096_f16"], progs["sigmoid_attn_n4096"]
    assert f16["dtype"] == "f16" and f16["degree"] == 4 and f16["params"]["squarings"] == 2
    q, k, v = am.make_inputs(3, H=1, S=512, spread=1.5)
    # bias as for n = 4096 keys (the programs absorb -ln 4096)
    outs16 = am.sigmoid_outputs(f16, q, k, v, bias=-math.log(4096), modes=("native", "poly"))
    outs16b = am.sigmoid_outputs(b16, q, k, v, bias=-math.log(4096), modes=("poly",))
    ref = outs16["ref"]
    native, poly16, poly_b16 = (_rel(o, ref) for o in (outs16["native"], outs16["poly"], outs16b["poly"]))
    assert poly16 < 2.0 * native, (poly16, native)
    assert poly_b16 > 2.0 * poly16, (poly_b16, poly16)


def test_softcap_f16_program_within_2x_native_at_gemma_spread():
    """The FP16 D5 softcap residual (softcap_c50_f16) keeps the attention output within 2x
    the native path's error at raw score std 10 logits (Gemma-like), where the BF16 D4
    program is several times worse."""
    progs = load_table()["programs"]
    f16, b16 = progs["softcap_c50_f16"], progs["softcap_c50"]
    assert f16["dtype"] == "f16" and f16["degree"] == 5
    q, k, v = am.make_inputs(5, H=1, S=512, spread=10.0)
    o16 = am.softcap_outputs(f16, q, k, v)
    ob = am.softcap_outputs(b16, q, k, v, modes=("poly",))
    ref = o16["ref"]
    native, poly16, poly_b16 = (_rel(o, ref) for o in (o16["native"], o16["poly"], ob["poly"]))
    assert poly16 < 2.0 * native, (poly16, native)
    assert poly_b16 > 2.0 * poly16, (poly_b16, poly16)
