"""flash_attn_poly: attention and activation kernels whose transcendental functions run as
packed-BF16 polynomial programs on the FMA pipe instead of the SFU (MUFU) pipe."""

__version__ = "0.1.0"
