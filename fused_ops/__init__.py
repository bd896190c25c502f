"""Fused CUDA ops with PyTorch reference fallbacks."""
