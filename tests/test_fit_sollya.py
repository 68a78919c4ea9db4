"""Sollya control (needs the `sollya` binary; CI installs it with apt-get)."""
import numpy as np
import pytest

from flash_attn_poly.fit import sollya
from flash_attn_poly.asm.programs import load_table

pytestmark = pytest.mark.sollya

if not sollya.available():
    pytest.skip(sollya.INSTALL_HINT, allow_module_level=True)


def test_fpminimax_sigmoid_d3_has_8bit_coefficients_and_fits():
    c = sollya.fpminimax("sigmoid", 3, 6.0, zero_c0=True)
    assert c[0] == 0.0 and len(c) == 4
    for v in c[1:]:
        m, _ = np.frexp(v)
        assert (m * 2**8) == np.round(m * 2**8)          # at most 8 significant bits
    t = np.linspace(0, 6, 2001)
    err = np.abs(np.polynomial.polynomial.polyval(t, c) - (1 / (1 + np.exp(-t)) - 0.5)).max()
    assert err < 0.01


def test_table2_sigmoid_row_sollya_is_the_bf16_floor():
    """Sollya's D3 sigmoid control at our clamp is the paper's 5.47e-3 and the exact optimum over
    every BF16 coefficient vector of the form (fit/lattice.py); ours on the 0.25 L_i grid is not."""
    from flash_attn_poly.fit.table2 import ROWS, table_row
    r = table_row(*ROWS[0], load_table())
    assert r["L_c"] == 6.0
    assert r["sollya_coeffs_bf16"] == [0.0, 0.28125, -0.053466796875, 0.003387451171875]
    assert round(r["sollya_real"], 5) == 5.47e-3
    assert r["sollya_real"] == pytest.approx(r["lattice_real"], rel=1e-12)
    assert r["grid_real"] == pytest.approx(r["ours_real"], rel=1e-12)
    assert r["lattice_real"] * 1.1 < r["grid_real"]
