"""Graphs of ggml-style tensors: build them, hash their structure."""

from .builder import GLU_OPS, ROPE_MODES, UNARY_OPS, GraphBuilder
from .dtypes import F16, F32, I32, DType, nbytes, row_bytes
from .errors import GraphBuildError
from .graph import Graph, structure_hash
from .tensor import VIEW_OPS, LeafKind, Tensor, leaf

__all__ = ["GLU_OPS", "ROPE_MODES", "UNARY_OPS", "GraphBuilder", "F16", "F32", "I32", "DType", "nbytes",
           "row_bytes", "GraphBuildError", "Graph", "structure_hash", "VIEW_OPS", "LeafKind", "Tensor", "leaf"]
