"""flash_attn_poly: attention and activation kernels whose transcendental functions run as
packed-BF16 polynomial programs on the FMA pipe instead of the SFU (MUFU) pipe."""
from .activations import PolyGeGLU, PolySiLU, PolySwiGLU, geglu, silu, swiglu
from .interface import attention
from .varlen import attention_varlen

__version__ = "0.1.0"
__all__ = ["attention", "attention_varlen", "silu", "swiglu", "geglu", "PolySiLU", "PolySwiGLU", "PolyGeGLU"]
