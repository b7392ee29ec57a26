"""Graph passes of the ``kiln`` backend (one module per pass): the BatchNorm fold on the
torch-level graph before tracing, the weight-only subgraph fold on the ATen graph after."""

from .fold_batchnorm import FoldedParams, fold_conv_batchnorm
from .fold_weight_subgraphs import fold_weight_subgraphs

__all__ = ["FoldedParams", "fold_conv_batchnorm", "fold_weight_subgraphs"]
