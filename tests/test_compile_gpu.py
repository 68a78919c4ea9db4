"""GPU tier: a compiled model step (issue 4). A tiny decoder (bench/tools/train_sanity.TinyLM: our
attention + the PolySwiGLU MLP) run eagerly and under torch.compile(fullgraph=True) must
give the same loss and gradients: both run the same kernels, the compiled graph only
rearranges the torch ops around them, so the gap is BF16 rounding of those ops.
Run on the H200: python -m pytest -q -m gpu tests/test_compile_gpu.py"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "tools"))


def _model(mode, evaluator):
    from train_sanity import TinyLM
    torch.manual_seed(0)
    return TinyLM(vocab=128, seq=256, d=256, layers=2, hq=4, hkv=2, hd=64, hidden=512, mode=mode,
                  evaluator=evaluator, mlp="poly", softcap=5.0, backend="cuda").cuda()


def _step(model, idx):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
    grads = torch.autograd.grad(loss, [p for p in model.parameters()])
    return loss.detach(), grads


@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "poly"),
                                            ("sigmoid", "poly")])
def test_compiled_step_matches_eager(mode, evaluator):
    idx = torch.randint(0, 128, (2, 257), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    model = _model(mode, evaluator)
    loss_e, grads_e = _step(model, idx)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)   # a graph break would raise here
    loss_c, grads_c = _step(compiled, idx)
    assert torch.isfinite(loss_c)
    assert abs(loss_c.item() - loss_e.item()) < 1e-2 * abs(loss_e.item()), (loss_c, loss_e)
    num = sum((a.float() - b.float()).pow(2).sum() for a, b in zip(grads_c, grads_e)).sqrt()
    den = sum(b.float().pow(2).sum() for b in grads_e).sqrt()
    assert (num / den).item() < 5e-2, (num / den).item()
