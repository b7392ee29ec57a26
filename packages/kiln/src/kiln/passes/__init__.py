"""Torch-level FX passes the ``kiln`` backend runs before tracing (one module per pass)."""

from .fold_batchnorm import FoldedParams, fold_conv_batchnorm

__all__ = ["FoldedParams", "fold_conv_batchnorm"]
