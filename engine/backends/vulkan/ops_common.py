"""Host-side mirror of the step buffer (`shaders/include/step.glsl`) for the ops wrappers/tests."""
from __future__ import annotations

import struct

# field order and types of `struct Step` in step.glsl (12 x 4 bytes)
STEP_FIELDS = (("pos", "I"), ("n_tokens", "I"), ("seed", "I"), ("top_k", "I"), ("temperature", "f"),
               ("top_p", "f"), ("min_p", "f"), ("rep_penalty", "f"), ("rep_window", "I"), ("flags", "I"),
               ("pad0", "I"), ("pad1", "I"))
_STEP = struct.Struct("<" + "".join(t for _, t in STEP_FIELDS))
STEP_BYTES = _STEP.size


def pack_step(pos: int = 0, n_tokens: int = 1, seed: int = 0, top_k: int = 0, temperature: float = 0.0,
              top_p: float = 1.0, min_p: float = 0.0, rep_penalty: float = 1.0, rep_window: int = 0,
              flags: int = 0) -> bytes:
    """The bytes of one Step, to write into the mapped step buffer."""
    return _STEP.pack(pos, n_tokens, seed & 0xFFFFFFFF, top_k, temperature, top_p, min_p, rep_penalty,
                      rep_window, flags, 0, 0)


def unpack_step(data: bytes) -> dict:
    return dict(zip((n for n, _ in STEP_FIELDS), _STEP.unpack(bytes(data[:STEP_BYTES]))))
