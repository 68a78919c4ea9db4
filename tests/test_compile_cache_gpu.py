"""The disk side of kernels/compile_cache.py on the GPU: a second process's first attention call
(forward + backward, per mode) runs kernels loaded from the cache, compiles nothing, and returns
what the process that compiled them returned."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = textwrap.dedent("""
    import json, sys
    import torch
    import flash_attn_poly
    from flash_attn_poly.kernels import compile_cache as cc
    mode, out_path = sys.argv[1], sys.argv[2]
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, s, h_q, h_kv, d = 1, 1000, 8, 2, 128       # S not a tile multiple: masked tail blocks
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for h in (h_q, h_kv, h_kv))
    do = torch.randn(b, s, h_q, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    kw = {"softcap": 50.0} if mode == "softcap" else {}
    o = flash_attn_poly.attention(q, k, v, mode, **kw)
    o.backward(do)
    torch.cuda.synchronize()
    torch.save({"o": o.detach().cpu(), "dq": q.grad.cpu(), "dk": k.grad.cpu(), "dv": v.grad.cpu()}, out_path)
    print(json.dumps(dict(cc.counters)))
""")


def _package_root() -> str:
    """The folder this process imports flash_attn_poly from (the device machine lays the package
    out under /tmp/fap_site; the repository root itself has no kernels/ inside the package)."""
    import flash_attn_poly
    return os.path.dirname(os.path.dirname(os.path.abspath(flash_attn_poly.__file__)))


def _run(mode, cache_dir, out_path):
    env = dict(os.environ, FLASH_ATTN_POLY_CACHE_DIR=str(cache_dir),
               PYTHONPATH=_package_root() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _CHILD, mode, str(out_path)], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["softmax", "softcap", "sigmoid"])
def test_second_process_loads_and_matches(mode, tmp_path):
    import torch

    cold = _run(mode, tmp_path / "cache", tmp_path / "cold.pt")
    assert cold.get("build", 0) >= 3 and cold.get("export", 0) == cold["build"], cold  # fwd, bwd, pre/post
    warm = _run(mode, tmp_path / "cache", tmp_path / "warm.pt")
    assert warm.get("build", 0) == 0 and warm.get("load", 0) == cold["build"], warm
    a, b = torch.load(tmp_path / "cold.pt"), torch.load(tmp_path / "warm.pt")
    assert torch.equal(a["o"], b["o"])          # the forward is deterministic: bit for bit
    for g in ("dq", "dk", "dv"):                # FP32 atomics in the backward: order may differ
        torch.testing.assert_close(b[g].float(), a[g].float(), rtol=2e-2, atol=2e-3, msg=g)
