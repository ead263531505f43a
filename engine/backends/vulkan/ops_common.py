"""The step buffer's layout, defined once: `STEP` packs it on the host and generates
`struct Step` in shaders/include/step.glsl (tools/build_shaders.py writes the file from
`step_glsl()`; tests/vulkan/test_shaders_fresh.py fails when the two disagree)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from phoenix_chat.engine.backends.vulkan.pipelines import PushLayout

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.memory import Buffer

STEP = PushLayout(
    "Step",
    [
        ("pos", "u32", "position of the first token of this submission"),
        ("n_tokens", "u32", "tokens in this submission (1 for decode)"),
        ("seed", "u32", "RNG seed; the sampler hashes (seed, pos)"),
        ("top_k", "u32", "0 = off"),
        ("temperature", "f32", "<= 0: greedy"),
        ("top_p", "f32", "1 = off"),
        ("min_p", "f32", "0 = off"),
        ("rep_penalty", "f32", "1 = off"),
        ("rep_window", "u32", "how many earlier tokens the penalty looks at"),
        ("flags", "u32"),
        ("slot", "u32", "KV slot: caches hold [slot][n_kv_heads][cache_slots][head_dim]"),
        ("tok_base", "u32", "where this sequence's ids start in tokens (slot * context_length)"),
    ],
)
STEP_BYTES = STEP.size

_STEP_HEADER = """\
// The per-step values of the token step. The host writes them through a mapped pointer;
// kernels read them here, never from push constants (a recorded command buffer freezes those).
//
// Token flow: `tokens` (uint[n_slots * context_length]) holds the ids of every position of every
// KV slot; a sequence's ids start at step.tok_base (indices below are relative to it). Prefill: the host
// writes tokens[pos .. pos+n_tokens). Decode: the embedding reads tokens[step.pos], the sampler
// writes tokens[step.pos + 1], and the step's last kernel increments step.pos, so a replayed
// command buffer needs nothing from the host. The host reads the new id from `tokens`.
"""
STEP_ROW_BYTES = 256  # a batched step's rows of Steps (batch.py) lie this far apart: any storage-offset alignment

_STEP_FOOTER = """
#ifdef STEP_ROWS
// A batched decode step (engine/backends/vulkan/batch.py): one Step per row, STEP_ROW_BYTES apart;
// `step` is the Step of row STEP_ROW (the kernel defines it, e.g. as a workgroup index).
struct StepRow { Step s; uint pad[STEP_ROW_PAD]; };
#define STEP_BUFFER(b) layout(binding = b) buffer StepBuf { StepRow step_rows[]; };
#define step step_rows[STEP_ROW].s
#else
#define STEP_BUFFER(b) layout(binding = b) buffer StepBuf { Step step; };
#endif
"""


def step_glsl() -> str:
    """The text of shaders/include/step.glsl (generated: edit `STEP` above, then `make shaders`)."""
    pad = f"#define STEP_ROW_PAD {(STEP_ROW_BYTES - STEP.size) // 4}\n"
    return _STEP_HEADER + STEP.struct_glsl() + "\n" + pad + _STEP_FOOTER


def pack_step(
    pos: int = 0,
    n_tokens: int = 1,
    seed: int = 0,
    top_k: int = 0,
    temperature: float = 0.0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    rep_penalty: float = 1.0,
    rep_window: int = 0,
    flags: int = 0,
    slot: int = 0,
    tok_base: int = 0,
) -> bytes:
    """The bytes of one Step, to write into the mapped step buffer."""
    return STEP.pack(
        pos=pos,
        n_tokens=n_tokens,
        seed=seed & 0xFFFFFFFF,
        top_k=top_k,
        temperature=temperature,
        top_p=top_p,
        min_p=min_p,
        rep_penalty=rep_penalty,
        rep_window=rep_window,
        flags=flags,
        slot=slot,
        tok_base=tok_base,
    )


def write_step(step_buffer: Buffer, **values: Any) -> None:  # values: pack_step's keywords
    """Write one Step (pack_step's arguments) into the mapped step buffer."""
    mapped = step_buffer.mapped
    if mapped is None:
        raise ValueError(f"step buffer {step_buffer.name!r} is not host-visible")
    mapped[:STEP_BYTES] = np.frombuffer(pack_step(**values), np.uint8)


def unpack_step(data: bytes) -> dict[str, int | float]:
    return STEP.unpack(data)
