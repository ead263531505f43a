"""Weights re-quantized on the device at load (`--quant`; shaders/quantize_weights.comp).

The source rows (as the file stores them: f32, f16 or bf16; other types dequantized to f32 by
the host first) go up in pieces through one scratch buffer, and the kernel writes GGUF blocks
straight into the weight's own buffer. The blocks are bit-identical to gguf-py's quantizer
(tests/vulkan/test_ops_quantize_weights.py), which runs at ~50-100 M weights/s in numpy: minutes
for a 27B BF16 checkpoint, where the device takes about as long as the upload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
from gguf import GGMLQuantizationType as QType

from phoenix_chat.engine.backends.vulkan.matvec import groups_2d, row_bytes
from phoenix_chat.engine.backends.vulkan.memory import Buffer, Tensor
from phoenix_chat.engine.backends.vulkan.ops_table import QUANTIZE_WEIGHT_TYPES

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device

SOURCE_KINDS = {QType.F32: 0, QType.F16: 1, QType.BF16: 2}  # the kernel's push `src_kind`
PIECE_BYTES = 32 << 20  # source bytes per dispatch (well under any maxStorageBufferRange)
WG = 64


def quantize_tensor(
    dev: Device, source: npt.NDArray[Any], src_type: QType, target: QType, shape: tuple[int, int], *, name: str = ""
) -> Tensor:
    """A new device Tensor holding `source` (rows x cols values of `src_type`) as `target` blocks."""
    rows, cols = shape
    if target.name not in QUANTIZE_WEIGHT_TYPES:
        raise ValueError(
            f"{name}: cannot quantize to {target.name} on the device (have {', '.join(QUANTIZE_WEIGHT_TYPES)})"
        )
    if src_type not in SOURCE_KINDS:
        raise ValueError(f"{name}: source type {src_type.name} must be F32, F16 or BF16 (dequantize it first)")
    per_block = 1 if target == QType.F16 else 32
    if cols % per_block:
        raise ValueError(f"{name}: rows of {cols} values are no whole {target.name} blocks of {per_block}")
    src = np.ascontiguousarray(source).reshape(-1).view(np.uint8)
    src_row = cols * (4 if src_type == QType.F32 else 2)
    if src.size != rows * src_row:
        raise ValueError(f"{name}: {src.size} B of source is not {rows} rows of {cols} {src_type.name}")
    dst_row = row_bytes(target, cols)
    out = Buffer(dev, rows * dst_row, name=name)
    rows_per = max(1, PIECE_BYTES // src_row)
    scratch = Buffer(dev, min(rows, rows_per) * src_row, name=f"{name} (source piece)")
    p = dev.pipeline(f"quantize_weights_{target.name.lower()}", WG=WG)
    align = max(dev.caps.min_storage_offset_alignment, 4)
    try:
        for r0 in range(0, rows, rows_per):
            n_rows = min(rows_per, rows - r0)
            dev.upload(scratch, src[r0 * src_row : (r0 + n_rows) * src_row])
            start, end = r0 * dst_row, (r0 + n_rows) * dst_row
            bind = start // align * align  # the binding starts aligned; the kernel skips to `start`
            n = n_rows * cols
            push = p.push.pack(n=n, src_kind=SOURCE_KINDS[src_type], dst_off=(start - bind) // 2)
            cl = dev.commands(name=f"quantize {name}")
            try:
                cl.dispatch(
                    p,
                    [(scratch, 0, n_rows * src_row), (out, bind, end - bind)],
                    groups_2d(-(-n // (per_block * WG))),
                    push,
                )
                cl.submit()
            finally:
                cl.destroy()
    except BaseException:
        out.destroy()
        raise
    finally:
        scratch.destroy()
    return Tensor(out, rows, dst_row, name)
