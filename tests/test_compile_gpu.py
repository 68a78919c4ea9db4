"""GPU tier: a compiled model step (issue 4). A tiny decoder (bench/tools/train_sanity.TinyLM: our
attention + the PolySwiGLU MLP) run eagerly and under torch.compile(fullgraph=True), each judged
against an FP32 reference of the same model (same weights, exact functions, no autocast: the
torch reference backends): the compiled step's loss and gradient error may be at most 2x the
eager step's error, plus a floor of eps(BF16) / 8 (relative).  The eager error is the measured
scale of what BF16 autocast and the polynomial programs cost this model, so a compiled graph
that rearranges the torch ops around the same kernels stays well inside it, and one whose
gradients drift to 4x the eager error (or that adds a gradient bug of a few % of the norm) fails
(tests/test_gpu_runs_cpu.py checks the comparison on synthetic gradients).

    python -m pytest -q -p no:cacheprovider -m gpu tests/test_compile_gpu.py -s       (the H200)
    FAP_TEST_BACKEND=reference python -m pytest -q -m gpu tests/test_compile_gpu.py  (CPU dry run:
        the reference backends, torch.compile with the aot_eager backend)
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "tools"))

import cases  # noqa: E402
import gpu_check as G  # noqa: E402

HONORS_TEST_BACKEND = True   # tests/conftest.py: FAP_TEST_BACKEND=reference runs these on the CPU

FACTOR = 2.0
FLOOR = torch.finfo(torch.bfloat16).eps / 8   # relative: a quarter of BF16's rounding
CONFIG = dict(vocab=128, seq=256, d=256, layers=2, hq=4, hkv=2, hd=64, hidden=512, softcap=5.0)


def _model(mode, evaluator, backend, mlp, seed):
    from train_sanity import TinyLM
    torch.manual_seed(seed)
    model = TinyLM(mode=mode, evaluator=evaluator, mlp=mlp, backend=backend, **CONFIG)
    if backend == "reference":   # the CPU dry run: the MLP's activation on the reference too (its
        for blk in model.blocks:   # default "auto" warns off the GPU, a graph break under fullgraph)
            if blk.act is not None:
                blk.act.backend = backend
    return model


def _step(model, idx, autocast):
    with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(idx[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())
    grads = torch.autograd.grad(loss, [p for p in model.parameters()])
    return loss.detach().double(), [g.detach().double() for g in grads]


def _rel_l2(grads, ref):
    num = sum((a - b).pow(2).sum() for a, b in zip(grads, ref)).sqrt()
    return (num / sum(b.pow(2).sum() for b in ref).sqrt()).item()


def compare(eager, compiled, ref) -> dict:
    """eager, compiled, ref: (loss, grads).  The compiled step's errors against the reference
    (loss: relative; gradients: rel L2 over all parameters) within FACTOR x the eager step's +
    FLOOR.  Returns the numbers and "ok"."""
    loss_r = ref[0].abs().item()
    out = {"loss_eager": abs(eager[0] - ref[0]).item() / loss_r,
           "loss_compiled": abs(compiled[0] - ref[0]).item() / loss_r,
           "grad_eager": _rel_l2(eager[1], ref[1]), "grad_compiled": _rel_l2(compiled[1], ref[1])}
    out["finite"] = bool(torch.isfinite(compiled[0]) and all(torch.isfinite(g).all() for g in compiled[1]))
    out["ok"] = out["finite"] and all(out[f"{n}_compiled"] <= FACTOR * out[f"{n}_eager"] + FLOOR
                                      for n in ("loss", "grad"))
    return out


@pytest.mark.parametrize("mode,evaluator", [("softmax", "native"), ("softcap", "poly"), ("sigmoid", "poly")])
def test_compiled_step_matches_eager(mode, evaluator):
    be, dev = G.backend(), G.device()
    seed = cases.stable_seed(f"compile/{mode}/{evaluator}")
    g = torch.Generator(dev).manual_seed(seed)
    idx = torch.randint(0, CONFIG["vocab"], (2, CONFIG["seq"] + 1), device=dev, generator=g)
    model = _model(mode, evaluator, be, "poly", seed).to(dev)
    # the reference: the same weights in FP32, exact attention and SiLU (torch), no autocast
    ref_model = _model(mode, evaluator, "reference", "exact", seed).to(dev)
    ref_model.load_state_dict(model.state_dict())
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False   # an FP32 reference, not TF32's 10-bit products
    try:
        ref = _step(ref_model, idx, autocast=False)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    eager = _step(model, idx, autocast=True)
    torch._dynamo.reset()
    # fullgraph: a graph break raises here; the CPU dry run traces with aot_eager (no C++ build)
    compiled_model = torch.compile(model, fullgraph=True, **({} if be == "cuda" else {"backend": "aot_eager"}))
    compiled = _step(compiled_model, idx, autocast=True)
    r = compare(eager, compiled, ref)
    print(f"\n{mode}/{evaluator}: loss error eager {r['loss_eager']:.2e} compiled {r['loss_compiled']:.2e}; "
          f"gradient rel L2 eager {r['grad_eager']:.2e} compiled {r['grad_compiled']:.2e}")
    assert r["ok"], r
