"""The lattice grids of the codebook weight types (IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S), as the bytes
their kernels read from the start of each such matrix's buffer (shaders/include/gguf_bytes.glsl).

The values are gguf-py's own tables (ggml's iq3xxs_grid, iq3s_grid, iq2xs_grid, iq2s_grid), so
the device decodes exactly what the CPU reference dequantizes. Putting the grid in the matrix's
buffer, not in a shader constant array (which NVIDIA turns into a per-invocation local-memory copy,
see include/iq4_values.glsl) or a binding of its own, keeps every kernel's binding list as it is.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from gguf import GGMLQuantizationType as QType
from gguf import quants

from phoenix_chat.engine.backends.vulkan.ops_table import CODEBOOK_TYPES

_CLASSES = {
    QType.IQ3_XXS: quants.IQ3_XXS,
    QType.IQ3_S: quants.IQ3_S,
    QType.IQ2_XS: quants.IQ2_XS,
    QType.IQ2_S: quants.IQ2_S,
}
assert {q.name for q in _CLASSES} == set(CODEBOOK_TYPES)


@cache
def grid_prefix(qtype: QType) -> bytes:
    """The grid bytes a matrix of `qtype` starts with on the device (b"" for other types): IQ3
    entries are 4 bytes, IQ2 entries 8, each byte one unsigned grid value."""
    cls = _CLASSES.get(QType(qtype))
    if cls is None:
        return b""
    cls.init_grid()  # type: ignore[no-untyped-call]  # gguf-py leaves it unannotated
    assert cls.grid is not None
    values = cls.grid.reshape(-1)
    return np.asarray(values, dtype=np.float32).astype(np.uint8).tobytes()
