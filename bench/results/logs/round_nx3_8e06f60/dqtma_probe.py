"""DEBUG (uncommitted): does a dq_tma backward finish?  One small case per process."""
import faulthandler, os, sys, time
faulthandler.dump_traceback_later(int(os.environ.get("PROBE_T", "40")), exit=True)
import torch
from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd
hl = sys.argv[1] == "1"
mode = sys.argv[2] if len(sys.argv) > 2 else "softmax"
b, s, hq, hkv, d = 1, 256, 2, 2, 128
g = torch.Generator(device="cuda").manual_seed(0)
mk = lambda h: torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
q, k, v, do, o = mk(hq), mk(hkv), mk(hkv), mk(hq), mk(hq)
lse = torch.randn(b, hq, s, device="cuda", generator=g) + 2 * 5.5
t = time.time()
kw = dict(mode=mode, causal=True, head_loop=hl)
ref = attn_bwd(do, q, k, v, o, lse, dq_tma=False, **kw); torch.cuda.synchronize()
print("ref done", time.time() - t, flush=True)
got = attn_bwd(do, q, k, v, o, lse, dq_tma=True, **kw)
print("launched", time.time() - t, flush=True)
torch.cuda.synchronize()
print("synced", time.time() - t, flush=True)
for n, a, r in zip("qkv", got, ref):
    print(n, "rel", ((a.float() - r.float()).norm() / r.float().norm()).item(), flush=True)
