"""Device layouts of the weight types: the skeleton's word layout (framework/core/weight_words.py: GGUF
blocks kept quantized, each f16 scale moved to a plane of its own where it breaks word alignment), which
the WGSL kernels read. A weight larger than the adapter's storage-binding limit is split into chunks of
whole rows, each its own buffer, and kernels run once per chunk."""

from __future__ import annotations

from ...backend import weight_words

D_OFFSET, QUANT_TYPES, FLOAT_TYPES, SUPPORTED = (weight_words.D_OFFSET, weight_words.QUANT_TYPES,
                                                 weight_words.FLOAT_TYPES, weight_words.SUPPORTED)
layout, row_bytes, repack = weight_words.layout, weight_words.row_bytes, weight_words.pack
