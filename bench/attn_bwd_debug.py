"""One-shot diagnostics for kernels/attn_bwd_sm90.py (B=1, S=128, H=1, D=128, not causal)."""
import math
import torch
from flash_attn_poly.kernels.attn_bwd_sm90 import attn_bwd

torch.manual_seed(0)
S, D = 128, 128
mk = lambda: torch.randn(1, S, 1, D, device="cuda", dtype=torch.bfloat16)
q, k, v, do = mk(), mk(), mk(), mk()
o = torch.zeros_like(q)
scale = D ** -0.5
# (1) P = 0 everywhere (LSE = +inf): every gradient must be exactly 0
lse_inf = torch.full((1, 1, S), math.inf, device="cuda")
g = attn_bwd(do, q, k, v, o, lse_inf, causal=False)
print("P=0: max|dq,dk,dv|", [t.abs().max().item() for t in g])
# (2) K = 0, LSE = ln S: P = 1/S uniform, D = 0 (O = 0): dv[n] = mean_m dO[m]
kz = torch.zeros_like(k)
lse_u = torch.full((1, 1, S), math.log(S), device="cuda")
dq, dk, dv = attn_bwd(do, q, kz, v, o, lse_u, causal=False)
exp_dv = do.float().mean(1, keepdim=True).expand_as(dv)
err = (dv.float() - exp_dv).abs()
print("uniform P: dv err max", err.max().item(), "exp |dv| max", exp_dv.abs().max().item())
print("  dv err by row block of 16:", [round(x, 3) for x in err[0, :, 0].reshape(8, 16, D).amax((1, 2)).tolist()])
print("  dv err by col block of 16:", [round(x, 3) for x in err[0, :, 0].reshape(S, 8, 16).amax((0, 2)).tolist()])
print("  dv[0,:4]", dv[0, 0, 0, :4].tolist(), "exp", exp_dv[0, 0, 0, :4].tolist())
print("  dv[70,:4]", dv[0, 70, 0, :4].tolist())
# dS = P * dP (D = 0), dP = dO V^T; dq = scale * dS K = 0 (K = 0); dk = scale * dS^T Q
dP = do[0, :, 0].float() @ v[0, :, 0].float().T            # (m, n)
dS = dP / S
exp_dk = scale * dS.T @ q[0, :, 0].float()
errk = (dk[0, :, 0].float() - exp_dk).abs()
print("uniform P: dk err max", errk.max().item(), "exp max", exp_dk.abs().max().item(), "dq max", dq.abs().max().item())
print("  dk err by row block:", [round(x, 3) for x in errk.reshape(8, 16, D).amax((1, 2)).tolist()])
print("  dk err by col block:", [round(x, 3) for x in errk.reshape(S, 8, 16).amax((0, 2)).tolist()])
# (3) random: S check through dv with dO = e_j-style: use full reference
x = (q[0, :, 0].float() @ k[0, :, 0].float().T) * scale
lse = torch.logsumexp(x, -1)
P = torch.exp(x - lse[:, None])
dq, dk, dv = attn_bwd(do, q, k, v, o, lse.view(1, 1, S), causal=False)
exp_dv = P.T @ do[0, :, 0].float()
errv = (dv[0, :, 0].float() - exp_dv).abs()
print("random: dv err max", errv.max().item(), "exp max", exp_dv.abs().max().item())
print("  dv err by row block:", [round(x, 3) for x in errv.reshape(8, 16, D).amax((1, 2)).tolist()])
print("  dv err by col block:", [round(x, 3) for x in errv.reshape(S, 8, 16).amax((0, 2)).tolist()])
