"""A small random-weight Gemma 3 vision-language checkpoint (`Gemma3ForConditionalGeneration`,
a Hugging Face folder), built deterministically with numpy so tests can rebuild it without torch.

`python -m tools.make_vision_goldens` loads the folder this writes with transformers (every
parameter must be present, none unexpected) and records the goldens in tests/goldens/.

Real structure, shrunk sizes (Gemma 3 4B's values in brackets):
- vision tower (SigLIP): patch 14 [14], image 112 px [896] -> 8 x 8 = 64 patches [4,096],
  width 32 [1152], MLP 64 [4304], 2 layers [27], 2 heads [16], LayerNorm eps 1e-6, no head;
- projector: average pool to mm_tokens_per_image = 16 soft tokens [256] (kernel 2 [4]),
  RMSNorm (1 + w) + a [vision width, text width] matrix;
- text model: width 64 [2560], 2 layers [34] (layer 0 sliding, window 8 [1024]; layer 1 global),
  2 query heads / 1 KV head of 32 [8/4 of 256], MLP 128 [10240]; the real vocabulary
  (262,208 rows: the embedded 270M's tokenizer plus `<image_soft_token>` = 262144), so the
  image token layout is the real one: `<start_of_image>` 255999, `<end_of_image>` 256000.
Matrices are stored in BF16 (as real checkpoints are), vectors in F32.

`text_layers=6` gives the same model with four more text layers (layer 5 global, the rest
sliding: Gemma 3's real pattern of one global layer in six, which is the only one a GGUF can say:
llama.cpp reads every Gemma 3 GGUF with it). Layers 0-1, the embedding, the vision tower and
the projector are bit for bit the default model's; layers 2-5 are drawn from a second stream.
tools/convert_with_llama_cpp.py converts that variant.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

IMAGE_TOKEN_ID = 262144
BOI_TOKEN_ID = 255999
EOI_TOKEN_ID = 256000
MM_TOKENS = 16

TEXT: dict[str, Any] = {
    "model_type": "gemma3_text",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "vocab_size": 262208,
    "max_position_embeddings": 512,
    "sliding_window": 8,
    "sliding_window_pattern": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 32,
    "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh",
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
}
VISION: dict[str, Any] = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_channels": 3,
    "image_size": 112,
    "patch_size": 14,
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_pytorch_tanh",
    "vision_use_head": False,
}

# Gemma 3's instruction-tuned chat template (the part that matters here: an image item renders
# as `<start_of_image>`, which the processor expands to the soft-token run)
CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


def text_config(text_layers: int = 2) -> dict[str, Any]:
    """TEXT, or with `text_layers` (> 2) layers in Gemma 3's real pattern (every 6th global)."""
    if text_layers == 2:
        return TEXT
    if text_layers < 6:
        raise ValueError("text_layers: 2 (the goldens' model) or at least 6 (one global layer in six)")
    kinds = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(text_layers)]
    return {**TEXT, "num_hidden_layers": text_layers, "sliding_window_pattern": 6, "layer_types": kinds}


def config(text_layers: int = 2) -> dict[str, object]:
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text_config(text_layers),
        "vision_config": VISION,
        "mm_tokens_per_image": MM_TOKENS,
        "image_token_index": IMAGE_TOKEN_ID,
        "boi_token_index": BOI_TOKEN_ID,
        "eoi_token_index": EOI_TOKEN_ID,
        "bos_token_id": 2,
        "eos_token_id": [1, 106],
        "pad_token_id": 0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    }


def tensors(seed: int = 0, text_layers: int = 2) -> dict[str, np.ndarray]:
    """Every parameter of the model, in transformers' names, as f32 (rounded to BF16 on writing)."""
    rng = np.random.default_rng(seed)
    t, v = text_config(2), VISION
    out: dict[str, np.ndarray] = {}

    def normal(name: str, shape: tuple[int, ...], std: float, mean: float = 0.0) -> None:
        out[name] = (mean + rng.normal(0.0, std, shape)).astype(np.float32)

    h, hd, ffn = int(t["hidden_size"]), int(t["head_dim"]), int(t["intermediate_size"])
    q, kv = int(t["num_attention_heads"]) * hd, int(t["num_key_value_heads"]) * hd
    lm = "model.language_model."
    normal(lm + "embed_tokens.weight", (int(t["vocab_size"]), h), 0.1)
    normal(lm + "norm.weight", (h,), 0.1)

    def text_layer(i: int) -> None:
        p = f"{lm}layers.{i}."
        for n in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            normal(p + n + ".weight", (h,), 0.1)
        normal(p + "self_attn.q_norm.weight", (hd,), 0.1)
        normal(p + "self_attn.k_norm.weight", (hd,), 0.1)
        normal(p + "self_attn.q_proj.weight", (q, h), 0.2)
        normal(p + "self_attn.k_proj.weight", (kv, h), 0.2)
        normal(p + "self_attn.v_proj.weight", (kv, h), 0.2)
        normal(p + "self_attn.o_proj.weight", (h, q), 0.2)
        normal(p + "mlp.gate_proj.weight", (ffn, h), 0.2)
        normal(p + "mlp.up_proj.weight", (ffn, h), 0.2)
        normal(p + "mlp.down_proj.weight", (h, ffn), 0.2)

    for i in range(int(t["num_hidden_layers"])):
        text_layer(i)

    vw, vffn, patch = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["patch_size"])
    patches = (int(v["image_size"]) // patch) ** 2
    vt = "model.vision_tower.vision_model."
    normal(vt + "embeddings.patch_embedding.weight", (vw, 3, patch, patch), 0.05)
    normal(vt + "embeddings.patch_embedding.bias", (vw,), 0.1)
    normal(vt + "embeddings.position_embedding.weight", (patches, vw), 0.5)
    for i in range(int(v["num_hidden_layers"])):
        p = f"{vt}encoder.layers.{i}."
        for n in ("layer_norm1", "layer_norm2"):
            normal(p + n + ".weight", (vw,), 0.1, 1.0)
            normal(p + n + ".bias", (vw,), 0.1)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            normal(p + f"self_attn.{n}.weight", (vw, vw), 0.2)
            normal(p + f"self_attn.{n}.bias", (vw,), 0.1)
        normal(p + "mlp.fc1.weight", (vffn, vw), 0.2)
        normal(p + "mlp.fc1.bias", (vffn,), 0.1)
        normal(p + "mlp.fc2.weight", (vw, vffn), 0.2)
        normal(p + "mlp.fc2.bias", (vw,), 0.1)
    normal(vt + "post_layernorm.weight", (vw,), 0.1, 1.0)
    normal(vt + "post_layernorm.bias", (vw,), 0.1)
    normal("model.multi_modal_projector.mm_soft_emb_norm.weight", (vw,), 0.1)
    normal("model.multi_modal_projector.mm_input_projection_weight", (vw, h), 0.2)
    rng = np.random.default_rng([seed, 1])  # the extra layers: the default model's draws stay as they were
    for i in range(2, text_layers):
        text_layer(i)
    return out


def _bf16_bytes(a: np.ndarray) -> bytes:
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16).tobytes()  # round to nearest even


def write_safetensors(path: Path, arrays: dict[str, np.ndarray]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, a in arrays.items():
        dtype, blob = ("BF16", _bf16_bytes(a)) if a.ndim >= 2 else ("F32", a.astype(np.float32).tobytes())
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for b in blobs:
            fh.write(b)


def write_tokenizer(folder: Path) -> None:
    """The embedded 270M's tokenizer (Gemma 3's vocabulary) plus `<image_soft_token>` = 262144."""
    from tokenizers import AddedToken

    from phoenix_chat.engine.weights import embedded_model_path, open_weights

    weights = open_weights(embedded_model_path())
    hf = weights.tokenizer().hf
    hf.add_special_tokens([AddedToken("<image_soft_token>", special=True, normalized=False)])
    if hf.token_to_id("<image_soft_token>") != IMAGE_TOKEN_ID:
        raise RuntimeError(f"<image_soft_token> got id {hf.token_to_id('<image_soft_token>')}, not {IMAGE_TOKEN_ID}")
    (folder / "tokenizer.json").write_text(hf.to_str())
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "GemmaTokenizer",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "add_bos_token": True,
                "add_eos_token": False,
                "extra_special_tokens": {
                    "boi_token": "<start_of_image>",
                    "eoi_token": "<end_of_image>",
                    "image_token": "<image_soft_token>",
                },
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )


def build(folder: str | Path, seed: int = 0, text_layers: int = 2) -> Path:
    """Write the checkpoint folder (config, weights, tokenizer, preprocessor settings)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config(text_layers), indent=1))
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "size": {"height": VISION["image_size"], "width": VISION["image_size"]},
                "resample": 2,
                "do_resize": True,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "do_convert_rgb": True,
                "do_pan_and_scan": False,
                "image_seq_length": MM_TOKENS,
            },
            indent=1,
        )
    )
    write_safetensors(folder / "model.safetensors", tensors(seed, text_layers))
    write_tokenizer(folder)
    return folder


if __name__ == "__main__":
    print(build(sys.argv[1] if len(sys.argv) > 1 else "tiny-gemma3-vision"))
