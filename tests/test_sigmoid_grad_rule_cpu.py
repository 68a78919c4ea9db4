"""CPU tier: the sigmoid poly backward's sigma' rules against the exact derivative.

"product" (default) takes p (1 - p) of the forward block's BF16 p; "surrogate" is the coupled
B3 block's factored D4 derivative. Measured on the H200 in attention units
(bench/results/accuracy.md, 96ac86f): the surrogate's dQ/dK error is 8x native's at score
spread 1 and 25x at 1.3; here the same gap shows per score, in the program replay."""
import math

import pytest
import torch

import poly_reference as PR


@pytest.mark.parametrize("spread", [1.0, 1.69, 2.5])
def test_product_rule_tracks_the_exact_derivative(spread):
    b = -math.log(4096)
    x = torch.randn(100_000, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * spread
    ex = torch.sigmoid(x + b)
    g_exact = ex * (1 - ex)
    rel = lambda a, r: ((a - r).norm() / r.norm()).item()
    fwd, g_prod = PR.sigmoid_fns(b, grad_rule="product", forward=False)   # the block's own P
    _, g_sur = PR.sigmoid_fns(b, grad_rule="surrogate")
    err_p, err_s, err_fwd = rel(g_prod(x), g_exact), rel(g_sur(x), g_exact), rel(fwd(x), ex)
    # product: sigma' as accurate as P itself (measured 1.2-1.6e-2); surrogate 2.9e-2 .. 1.1e-1
    assert err_p < 1.1 * err_fwd + 1e-3, (err_p, err_fwd)
    assert err_p < err_s / 2, (err_p, err_s)
