"""The vision tower's kernels (shaders/vision.comp, vision_attention.comp) and the text
prefill's image path (the soft-token overlay; attention_prefill.comp's ATTN_SPANS variant):
their pipeline variants, merged into the one table in `pipelines.py`, and one recording
function each. f32 throughout; no kernel here uses subgroup operations (reductions go through
shared memory), so none depends on the subgroup size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phoenix_chat.engine.backends.vulkan.variants import PushLayout, Variant

if TYPE_CHECKING:
    from phoenix_chat.engine.backends.vulkan.device import Device
    from phoenix_chat.engine.backends.vulkan.memory import Binding
    from phoenix_chat.engine.backends.vulkan.recorder import CommandList

VISION_PUSH = PushLayout(
    "vision",
    [
        ("n", "u32"),  # floats per row
        ("mode", "u32"),  # VISION_BIAS: BIAS_* below
        ("side", "u32"),  # VISION_POOL: patches per side of the grid
        ("k", "u32"),  # VISION_POOL: patches per side of one token's block
        ("eps", "f32"),  # VISION_LAYERNORM
    ],
)
VISION_ATTN_PUSH = PushLayout(
    "vision_attention",
    [
        ("n_tokens", "u32"),  # patches of the picture
        ("n_heads", "u32"),
        ("stride", "u32"),  # floats from one patch's q/k/v row to the next
        ("k_off", "u32"),  # floats: where k starts in a row (q at 0)
        ("v_off", "u32"),
        ("scale", "f32"),  # head_dim ** -0.5
    ],
)
ATTN_PREFILL_SPANS_PUSH = PushLayout(
    "attention_prefill",
    [
        ("head_dim", "u32"),
        ("n_heads", "u32"),
        ("n_kv_heads", "u32"),
        ("q_stride", "u32"),
        ("q_offset", "u32"),
        ("cache_slots", "u32"),
        ("window", "u32"),
        ("scale", "f32"),
    ],
)  # the same block as ops_table.ATTN_PREFILL_PUSH (attention_prefill.comp's one layout)

BIAS, BIAS_GELU, BIAS_RESIDUAL, BIAS_POSITION = 0, 1, 2, 3  # VISION_BIAS modes
WG = 256
ATTN_WG = 128

VARIANTS: list[Variant] = [
    Variant("vision_layernorm_f32", "vision.comp", 4, VISION_PUSH, {"VISION_LAYERNORM": None}, {"WG": (0, WG)}),
    Variant("vision_bias_f32", "vision.comp", 3, VISION_PUSH, {"VISION_BIAS": None}, {"WG": (0, WG)}),
    Variant("vision_pool_f32", "vision.comp", 2, VISION_PUSH, {"VISION_POOL": None}, {"WG": (0, WG)}),
    Variant("vision_overlay_f32", "vision.comp", 3, VISION_PUSH, {"VISION_OVERLAY": None}, {"WG": (0, WG)}),
    Variant(
        "vision_attention_f32",
        "vision_attention.comp",
        2,
        VISION_ATTN_PUSH,
        {},
        {"WG": (0, ATTN_WG), "BC": (1, 64), "HD": (2, 72)},
    ),
    # the text prefill's attention with pictures: a picture's tokens see each other both ways
    Variant(
        "attention_prefill_f16_f32_spans",
        "attention_prefill.comp",
        6,
        ATTN_PREFILL_SPANS_PUSH,
        {"ATTN_SPANS": None},
        {"WG": (0, 128), "BQ": (1, 8), "BC": (2, 32), "HD": (3, 256)},
    ),
]


def layer_norm(
    cl: CommandList, dev: Device, x: Binding, w: Binding, b: Binding, y: Binding, *, rows: int, n: int, eps: float
) -> None:
    """y[r] = LayerNorm(x[r]) * w + b (mean and variance in f32, as the numpy reference)."""
    p = dev.pipeline("vision_layernorm_f32", WG=WG)
    cl.dispatch(p, [x, w, b, y], groups=(rows, 1, 1), push=p.push.pack(n=n, mode=0, side=0, k=0, eps=eps))


def bias(cl: CommandList, dev: Device, y: Binding, b: Binding, aux: Binding, *, rows: int, n: int, mode: int) -> None:
    """v = y + b per row; BIAS: y = v, BIAS_GELU: y = gelu_tanh(v), BIAS_RESIDUAL: aux += v,
    BIAS_POSITION: y = v + aux (aux: the position embedding table, rows x n). `aux` is bound in
    every mode (give `y` where the mode does not read it)."""
    p = dev.pipeline("vision_bias_f32", WG=WG)
    push = p.push.pack(n=n, mode=mode, side=0, k=0, eps=0.0)
    cl.dispatch(p, [y, b, aux], groups=(-(-n // WG), rows, 1), push=push)


def pool(cl: CommandList, dev: Device, x: Binding, y: Binding, *, side: int, k: int, n: int) -> None:
    """y = the average of each k x k block of the side x side grid of rows in x (row-major)."""
    p = dev.pipeline("vision_pool_f32", WG=WG)
    tokens = (side // k) ** 2
    cl.dispatch(p, [x, y], groups=(-(-n // WG), tokens, 1), push=p.push.pack(n=n, mode=0, side=side, k=k, eps=0.0))


def overlay(cl: CommandList, dev: Device, flags: Binding, rows: Binding, x: Binding, *, tokens: int, n: int) -> None:
    """x[t] = rows[t] where flags[t] != 0 (u32 per token): soft tokens over the placeholders."""
    p = dev.pipeline("vision_overlay_f32", WG=WG)
    push = p.push.pack(n=n, mode=0, side=0, k=0, eps=0.0)
    cl.dispatch(p, [flags, rows, x], groups=(-(-n // WG), tokens, 1), push=push)


def attention_tile(dev: Device, head_dim: int) -> int:
    """Key rows per shared tile: 64 where K and V tiles of head_dim fit the shared memory, else 32."""
    return 64 if 2 * 64 * head_dim * 4 <= dev.caps.shared_memory else 32


def attention(
    cl: CommandList,
    dev: Device,
    qkv: Binding,
    out: Binding,
    *,
    n_tokens: int,
    n_heads: int,
    head_dim: int,
    stride: int,
    k_off: int,
    v_off: int,
) -> None:
    """out = softmax(q k^T / sqrt(head_dim)) v per head over all n_tokens (no mask)."""
    if head_dim % 4 or stride % 4 or k_off % 4 or v_off % 4:
        raise ValueError(f"vision attention: head_dim {head_dim}, stride and offsets must be multiples of 4")
    bc = attention_tile(dev, head_dim)
    if 2 * bc * head_dim * 4 > dev.caps.shared_memory:
        raise ValueError(f"vision attention: head_dim {head_dim} needs more shared memory than {dev.name} has")
    p = dev.pipeline("vision_attention_f32", WG=ATTN_WG, BC=bc, HD=head_dim)
    push = p.push.pack(
        n_tokens=n_tokens, n_heads=n_heads, stride=stride, k_off=k_off, v_off=v_off, scale=float(head_dim**-0.5)
    )
    cl.dispatch(p, [qkv, out], groups=(-(-n_tokens // ATTN_WG), n_heads, 1), push=push)
