"""Adapters that plug flash_attn_poly into other libraries (transformers, flash-attn-4)."""
