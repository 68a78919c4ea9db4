"""CPU: the attention-output error diagnostics of fit.attn_metric order as the numerics say."""
import math

import torch

from flash_attn_poly.fit import attn_metric as am
from flash_attn_poly.fit.programs import load_table


def _rel(o, ref):
    return math.sqrt(float(((o - ref) ** 2).sum()) / float((ref ** 2).sum()))


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
