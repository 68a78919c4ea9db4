"""attention()'s input checks, one case each, as a new user gets them wrong (issue 26, item 6):
every bad value raises the documented exception type with a message that names the parameter;
the number types a user may reasonably pass (numpy scalars, 0-d tensors) are taken.  And
backend="auto" never runs something backend="cuda" refuses without saying so."""
import warnings

import numpy as np
import pytest
import torch

import flash_attn_poly.interface as fi


def _qkv(d=64, dtype=torch.bfloat16, s=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda h: torch.randn(1, s, h, d, generator=g).to(dtype)
    return mk(4), mk(2), mk(2)


# (keyword arguments, exception type, the parameter the message must name first)
BAD = {
    "causal-str-no": (dict(causal="no"), TypeError, "causal"),
    "causal-int": (dict(causal=1), TypeError, "causal"),
    "causal-tensor": (dict(causal=torch.tensor(True)), TypeError, "causal"),
    "softcap-bool": (dict(mode="softcap", softcap=True), TypeError, "softcap"),
    "softcap-str": (dict(mode="softcap", softcap="50"), TypeError, "softcap"),
    "softcap-numpy-bool": (dict(mode="softcap", softcap=np.bool_(True)), TypeError, "softcap"),
    "softcap-1d-tensor": (dict(mode="softcap", softcap=torch.tensor([50.0])), TypeError, "softcap"),
    "softcap-bool-tensor": (dict(mode="softcap", softcap=torch.tensor(True)), TypeError, "softcap"),
    "softcap-nan": (dict(mode="softcap", softcap=float("nan")), ValueError, "softcap"),
    "softcap-zero": (dict(mode="softcap", softcap=0.0), ValueError, "mode='softcap' needs a finite softcap"),
    "sigmoid-bias-str": (dict(mode="sigmoid", sigmoid_bias="x"), TypeError, "sigmoid_bias"),
    "sigmoid-bias-bool": (dict(mode="sigmoid", sigmoid_bias=False), TypeError, "sigmoid_bias"),
    "sigmoid-bias-inf": (dict(mode="sigmoid", sigmoid_bias=-float("inf")), ValueError, "sigmoid_bias"),
    "softmax-scale-str": (dict(softmax_scale="0.1"), TypeError, "softmax_scale"),
    "softmax-scale-bool": (dict(softmax_scale=True), TypeError, "softmax_scale"),
    "softmax-scale-negative": (dict(softmax_scale=-0.125), ValueError, "softmax_scale"),
    "window-bool-left": (dict(window_size=(True, 0)), ValueError, "window_size"),
    "window-int": (dict(window_size=5), TypeError, "window_size"),
    "window-none": (dict(window_size=None), TypeError, "window_size"),
    "window-str": (dict(window_size="ab"), ValueError, "window_size"),
    "window-float": (dict(window_size=(1.5, 0)), ValueError, "window_size"),
    "window-triple": (dict(window_size=(1, 2, 3)), ValueError, "window_size"),
    "window-below-minus-one": (dict(window_size=(-2, 0)), ValueError, "window_size"),
    "return-lse-str": (dict(return_lse="no"), TypeError, "return_lse"),
    "deterministic-str": (dict(deterministic="yes"), TypeError, "deterministic"),
    "mode-typo": (dict(mode="softmx"), ValueError, "mode"),
    "evaluator-typo": (dict(evaluator="polynomial"), ValueError, "evaluator"),
    "backend-typo": (dict(backend="gpu"), ValueError, "backend"),
    # values finite in Python that FP32 is not, an unordered window, a score_mod that is no function
    "softmax-scale-fp32-overflow": (dict(softmax_scale=1e39), ValueError, "softmax_scale"),
    "sigmoid-bias-fp32-overflow": (dict(mode="sigmoid", sigmoid_bias=-1e39), ValueError, "sigmoid_bias"),
    "softcap-subnormal": (dict(mode="softcap", softcap=1e-50), ValueError, "mode='softcap' needs a finite softcap"),
    "window-set": (dict(window_size={5, 0}, causal=False), TypeError, "window_size"),
    "window-dict": (dict(window_size={0: 5, 1: 0}, causal=False), TypeError, "window_size"),
    "score-mod-list": (dict(score_mod=[abs]), TypeError, "score_mod"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_option_names_itself(case):
    kw, err, name = BAD[case]
    kw = {"backend": "reference", **kw}
    q, k, v = _qkv()
    with pytest.raises(err) as e:
        fi.attention(q, k, v, **kw)
    assert e.type is err, f"{case}: {e.type.__name__} {e.value}"
    assert str(e.value).startswith(name), f"{case}: the message does not lead with {name!r}: {e.value}"


@pytest.mark.parametrize("cap", [np.float32(10.0), np.float64(10.0), np.int64(10), torch.tensor(10.0),
                                 torch.tensor(10, dtype=torch.int32), 10],
                         ids=["np.float32", "np.float64", "np.int64", "0d-tensor", "0d-int-tensor", "int"])
def test_softcap_takes_any_real_number(cap):
    """numpy scalars and 0-d tensors are numbers: the same call, the same output as 10.0."""
    q, k, v = _qkv()
    want = fi.attention(q, k, v, "softcap", softcap=10.0, backend="reference")
    assert fi.validate(q, k, v, "softcap", "poly", True, cap, None, None).softcap == 10.0
    assert torch.equal(fi.attention(q, k, v, "softcap", softcap=cap, backend="reference"), want)


@pytest.mark.parametrize("bias", [np.float32(-2.0), torch.tensor(-2.0), -2])
def test_sigmoid_bias_takes_any_real_number(bias):
    q, k, v = _qkv()
    assert fi.validate(q, k, v, "sigmoid", "poly", True, None, bias, None).sigmoid_bias == -2.0


def test_numpy_bool_is_a_bool():
    """numpy's bool scalar is taken as the bool it is (numbers are taken from numpy as well); a
    refused type is named with its module, never as a bare 'bool'."""
    q, k, v = _qkv()
    want = fi.attention(q, k, v, causal=False, backend="reference")
    assert torch.equal(fi.attention(q, k, v, causal=np.bool_(False), backend="reference"), want)
    with pytest.raises(TypeError, match=r"causal must be a bool, got numpy\.float64"):
        fi.attention(q, k, v, causal=np.float64(1.0), backend="reference")


@pytest.mark.parametrize("which", ["q-head-dim-0", "all-head-dim-0", "q-no-heads", "kv-no-heads"])
def test_empty_head_dims_are_refused(which):
    """head_dim 0 (the default scale would divide by zero) and zero heads (an empty output that
    looks like success) are errors naming the tensor."""
    q, k, v = _qkv()
    if which == "q-head-dim-0":
        q = q[..., :0]
    elif which == "all-head-dim-0":
        q, k, v = q[..., :0], k[..., :0], v[..., :0]
    elif which == "q-no-heads":
        q = q[:, :, :0]
    else:
        k, v = k[:, :, :0], v[:, :, :0]
    with pytest.raises(ValueError, match="head_dim must be > 0|at least one head"):
        fi.attention(q, k, v, backend="reference")


def test_window_takes_numpy_ints():
    q, k, v = _qkv()
    w = fi.validate(q, k, v, causal=False, window_size=(np.int64(4), np.int32(0))).window
    assert w == (4, 0) and all(type(x) is int for x in w)
    assert fi.validate(q, k, v, window_size=[3, -1]).window == (3, -1)


# ------------------------------------------------------------------------------ backend choice
def _call(d=64, dtype=torch.bfloat16):
    q, k, v = _qkv(d, dtype)
    return fi.validate(q, k, v)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_auto_takes_the_kernels_where_they_run(d):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for backend in ("auto", "cuda"):
            assert fi._pick_backend(backend, _call(d), torch.device("cuda", 0), (9, 0)) == "cuda"


@pytest.mark.parametrize("call, cap, err, match", [
    (_call(96), (9, 0), ValueError, "head_dim 96 is not supported by the CUDA kernels"),
    (_call(32), (9, 0), ValueError, "head_dim 32 is not supported"),
    (_call(64, torch.float32), (9, 0), TypeError, "the CUDA kernels take torch.bfloat16 or torch.float16, got dtype fp32"),
    (_call(128), (8, 0), RuntimeError, "this GPU is sm_80"),
], ids=["head_dim96", "head_dim32", "fp32", "sm80"])
def test_auto_falls_back_with_a_warning_where_cuda_refuses(call, cap, err, match):
    """On an sm_90 GPU (its capability stood in): what backend="cuda" refuses with an error,
    backend="auto" runs on the reference with a warning giving the same reason."""
    dev = torch.device("cuda", 0)
    with pytest.warns(UserWarning, match=match + ".*slow torch reference"):
        assert fi._pick_backend("auto", call, dev, cap) == "reference"
    with pytest.raises(err, match="^backend='cuda': .*" + match):
        fi._pick_backend("cuda", call, dev, cap)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fi._pick_backend("reference", call, dev, cap) == "reference"


def test_auto_head_dim_96_through_attention(monkeypatch):
    """attention(backend="auto") with head_dim 96 on an sm_90 device (stood in: CPU tensors that
    report capability 9.0): the reference's result, with the warning naming head_dim; "cuda"
    refuses with the same reason, before any kernel is looked at."""
    monkeypatch.setattr(fi, "_capability", lambda t: (9, 0))
    q, k, v = _qkv(96)
    with pytest.warns(UserWarning, match="head_dim 96 is not supported by the CUDA kernels") as rec:
        out = fi.attention(q, k, v)
    assert rec[0].filename == __file__      # the warning points at the caller's line
    assert torch.equal(out, fi.attention(q, k, v, backend="reference"))
    with pytest.raises(ValueError, match="head_dim 96"):
        fi.attention(q, k, v, backend="cuda")
