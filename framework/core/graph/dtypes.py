"""Tensor element types: GGUF's own enum, plus the byte-size arithmetic every loader needs."""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

DType = GGMLQuantizationType

F32 = DType.F32
F16 = DType.F16
I32 = DType.I32

# Types whose values numpy can hold directly (everything else is block-quantized).
NUMPY_TYPES = {DType.F32: "float32", DType.F16: "float16", DType.I32: "int32", DType.F64: "float64",
               DType.I8: "int8", DType.I16: "int16", DType.I64: "int64"}


def block_shape(dtype: DType) -> tuple[int, int]:
    """(elements per block, bytes per block) for a dtype."""
    return GGML_QUANT_SIZES[dtype]


def row_bytes(dtype: DType, n_cols: int) -> int:
    """Bytes of one row of n_cols elements; raises when n_cols does not fill whole blocks."""
    per_block, block_bytes = block_shape(dtype)
    if n_cols % per_block:
        raise ValueError(f"a row of {n_cols} elements is not a whole number of {dtype.name} blocks "
                         f"({per_block} elements each)")
    return n_cols // per_block * block_bytes


def nbytes(dtype: DType, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of this dtype and (numpy-order) shape occupies."""
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows * row_bytes(dtype, shape[-1]) if shape else block_shape(dtype)[1]
