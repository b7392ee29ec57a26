"""Triton code generation for kiln (not built yet; see README.md)."""
