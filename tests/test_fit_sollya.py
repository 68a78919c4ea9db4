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


def test_table2_row_shape():
    from flash_attn_poly.fit.table2 import ROWS, table_rows
    t = load_table()
    rows = table_rows(t)
    assert [r["function"] for r in rows] == [r[0] for r in ROWS]
    for r in rows:
        for k in ("ours_real", "sollya_real", "ours_bf16_fma", "sollya_bf16_fma"):
            assert 0 < r[k] < 0.2, (r["function"], k)
