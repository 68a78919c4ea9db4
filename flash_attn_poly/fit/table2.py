"""Table 2: our constrained programs vs same-form Sollya fpminimax controls."""
from __future__ import annotations

import numpy as np

from . import runtime as rt
from . import sollya
from ..asm.programs import load_table
from .search import score_points
from .targets import TARGETS

# (function, table name, target key): D3 sigmoid forward as in the seed, D4 elsewhere;
# derivative rows use the direct parity fits.
ROWS = [
    ("sigmoid", "sigmoid_d3", "sigmoid"),
    ("sigmoid'", "sigmoid_d4_grad", "sigmoid_grad"),
    ("tanh", "tanh_d4", "tanh"),
    ("tanh'", "tanh_d4_grad_direct", "tanh_grad"),
    ("silu", "silu_d4", "silu"),
    ("silu'", "silu_d4_grad", "silu_grad"),
    ("gelu", "gelu_d4", "gelu"),
    ("gelu'", "gelu_d4_grad", "gelu_grad"),
]
N_REAL = 20001


def real_error(p, f):
    """Real arithmetic on 20,001 uniform points over [-L_c, L_c] (the seed's control)."""
    x = np.linspace(-p["L_c"], p["L_c"], N_REAL)
    return float(np.abs(rt.replay(p, x, "real") - f(x)).max())


def fused_error(p, f):
    """Our deployed fused-order replay on the search's score points (8,000 per sign over [0, 12])."""
    x = score_points()
    xr = rt.round_to(rt.round_to(x, "f32"), p["dtype"])
    return float(np.abs(rt.replay(p, x, "fused") - f(xr)).max())


def table_rows(table=None, progress=False):
    table = table or load_table()
    rows = []
    it = ROWS
    if progress:
        from tqdm import tqdm
        it = tqdm(ROWS, desc="table2 (sollya)", leave=False)
    for fn, name, key in it:
        ours = table["programs"][name]
        ctl = sollya.control_program(ours, key)
        f = TARGETS[key].f
        rows.append({
            "function": fn, "program": name, "degree": ours["degree"], "L_c": ours["L_c"],
            "ours_real": real_error(ours, f), "sollya_real": real_error(ctl, f),
            "ours_bf16_fma": fused_error(ours, f), "sollya_bf16_fma": fused_error(ctl, f),
            "sollya_coeffs_bf16": ctl["coeffs"],
        })
    return rows
