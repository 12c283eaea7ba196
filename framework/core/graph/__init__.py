"""Graphs of ggml-style tensors: the op table, building graphs, their fragments, structure hashes."""

from . import ops
from .builder import GraphBuilder
from .dtypes import F16, F32, I32, DType, nbytes, row_bytes
from .errors import GraphBuildError
from .fragment import Fragment
from .graph import Graph, structure_hash
from .ops import GLU_OPS, OPS, ROPE_MODES, UNARY_OPS, VIEW_OPS, Kind, OpSpec
from .tensor import LeafKind, Tensor, leaf

__all__ = ["ops", "GLU_OPS", "OPS", "ROPE_MODES", "UNARY_OPS", "VIEW_OPS", "Kind", "OpSpec", "GraphBuilder", "F16",
           "F32", "I32", "DType", "nbytes", "row_bytes", "GraphBuildError", "Fragment", "Graph", "structure_hash",
           "LeafKind", "Tensor", "leaf"]
