"""Device layouts of the weight types: the skeleton's word layout (framework/core/weight_words.py: GGUF
blocks kept quantized, each f16 scale moved to a plane of its own where it breaks word alignment), and
the numbers the OpenCL kernels read it through (``kernel_defines``: words a block, groups a block), so
that the geometry is known in one place. A weight larger than the device's largest allocation
(CL_DEVICE_MAX_MEM_ALLOC_SIZE) is split into chunks of whole rows, each its own buffer."""

from __future__ import annotations

from ...backend import weight_words

QUANT_TYPES, FLOAT_TYPES, SUPPORTED, GROUP = (weight_words.QUANT_TYPES, weight_words.FLOAT_TYPES,
                                              weight_words.SUPPORTED, weight_words.GROUP)
layout, row_bytes, packed_nbytes = weight_words.layout, weight_words.row_bytes, weight_words.packed_nbytes


def kernel_defines(dtype: str) -> dict[str, int]:
    """The layout's numbers as the kernels read them (build options)."""
    lay = layout(dtype)
    return {"QT_" + dtype: 1, "QT_WPB": lay.words_per_block, "QT_GPB": lay.block_elems // GROUP}
