"""One `ModelConfig` for Gemma 3, whatever file it came from.

GGUF metadata and Hugging Face `config.json` name the same facts differently; both are
mapped here once so every backend reads the same fields.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phoenix_chat.engine.errors import ModelFileError, UnsupportedModelError

SUPPORTED_ARCHITECTURES = ("gemma3",)


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    sliding_window: int
    sliding_window_pattern: int = 6  # every 6th layer is global
    rope_theta: float = 1_000_000.0  # global layers
    rope_local_theta: float = 10_000.0  # sliding-window layers
    rope_scaling_factor: float = 1.0  # linear scaling, global layers only
    query_pre_attn_scalar: float = 256.0
    rms_norm_eps: float = 1e-6
    name: str = "Gemma 3"
    bos_token_id: int = 2
    eos_token_ids: tuple[int, ...] = (1, 106)
    pad_token_id: int = 0

    def is_global_layer(self, layer: int) -> bool:
        return (layer + 1) % self.sliding_window_pattern == 0

    def rope_base(self, layer: int) -> float:
        return self.rope_theta if self.is_global_layer(layer) else self.rope_local_theta

    def rope_scale(self, layer: int) -> float:
        return self.rope_scaling_factor if self.is_global_layer(layer) else 1.0

    @property
    def attn_scale(self) -> float:
        return 1.0 / math.sqrt(self.query_pre_attn_scalar)

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.hidden_size)

    def parameter_count(self) -> int:
        per_layer = (
            self.hidden_size * (self.q_dim + 2 * self.kv_dim)  # q, k, v
            + self.q_dim * self.hidden_size  # o
            + 3 * self.hidden_size * self.intermediate_size  # gate, up, down
            + 4 * self.hidden_size
            + 2 * self.head_dim  # norms
        )
        return self.vocab_size * self.hidden_size + self.num_layers * per_layer + self.hidden_size

    # ---- sources -------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any], path: str | os.PathLike[str]) -> ModelConfig:
        arch = meta.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                path, f"unsupported architecture {arch!r} (Phoenix Chat runs: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )

        def need(key: str) -> Any:
            full = f"{arch}.{key}"
            if full not in meta:
                raise ModelFileError(path, f"missing metadata key {full!r}")
            return meta[full]

        hidden = int(need("embedding_length"))
        heads = int(need("attention.head_count"))
        head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
        tokens = meta.get("tokenizer.ggml.tokens")
        vocab = len(tokens) if tokens is not None else int(meta.get(f"{arch}.vocab_size", 262144))
        scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
        factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0)) if scaling_type == "linear" else 1.0
        layers = int(need("block_count"))
        eos = int(meta.get("tokenizer.ggml.eos_token_id", 1))
        eot = _find_token(tokens, "<end_of_turn>")
        return cls(
            architecture=arch,
            num_layers=layers,
            hidden_size=hidden,
            intermediate_size=int(need("feed_forward_length")),
            num_heads=heads,
            num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=head_dim,
            vocab_size=vocab,
            context_length=int(need("context_length")),
            sliding_window=int(meta.get(f"{arch}.attention.sliding_window", 512)),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base", 1_000_000.0)),
            rope_scaling_factor=factor,
            query_pre_attn_scalar=float(_gguf_query_pre_attn_scalar(meta, arch, hidden, heads, head_dim, layers)),
            rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
            name=str(meta.get("general.name", "Gemma 3")),
            bos_token_id=int(meta.get("tokenizer.ggml.bos_token_id", 2)),
            eos_token_ids=tuple(sorted({eos} | ({eot} if eot is not None else set()))),
            pad_token_id=int(meta.get("tokenizer.ggml.padding_token_id", 0)),
        )

    @classmethod
    def from_hf_config(cls, config_path: Path) -> ModelConfig:
        try:
            raw = json.loads(Path(config_path).read_text())
        except FileNotFoundError:
            raise ModelFileError(config_path, "missing config.json") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelFileError(config_path, f"config.json is not valid JSON ({exc})") from None
        text = raw.get("text_config", raw)  # multimodal 4B/12B/27B nest the text model
        model_type = text.get("model_type", raw.get("model_type", ""))
        if model_type not in ("gemma3_text", "gemma3"):
            raise UnsupportedModelError(
                config_path, f"unsupported model_type {model_type!r} (expected gemma3 / gemma3_text)"
            )
        try:
            hidden = int(text["hidden_size"])
            heads = int(text["num_attention_heads"])
            scaling = text.get("rope_scaling") or {}
            factor = (
                float(scaling.get("factor", 1.0)) if scaling.get("rope_type", scaling.get("type")) == "linear" else 1.0
            )
            eos = raw.get("eos_token_id", text.get("eos_token_id", [1, 106]))
            eos = tuple(sorted(set(eos if isinstance(eos, list) else [eos]) | {106}))
            return cls(
                architecture="gemma3",
                num_layers=int(text["num_hidden_layers"]),
                hidden_size=hidden,
                intermediate_size=int(text["intermediate_size"]),
                num_heads=heads,
                num_kv_heads=int(text.get("num_key_value_heads", heads)),
                head_dim=int(text.get("head_dim", 256)),
                vocab_size=int(text.get("vocab_size", 262208)),
                context_length=int(text.get("max_position_embeddings", 131072)),
                sliding_window=int(text.get("sliding_window", 1024)),
                sliding_window_pattern=int(text.get("sliding_window_pattern", 6)),
                rope_theta=float(text.get("rope_theta", 1_000_000.0)),
                rope_local_theta=float(text.get("rope_local_base_freq", 10_000.0)),
                rope_scaling_factor=factor,
                query_pre_attn_scalar=float(text.get("query_pre_attn_scalar", 256)),
                rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
                name=str(raw.get("_name_or_path") or Path(config_path).parent.name),
                bos_token_id=int(raw.get("bos_token_id", text.get("bos_token_id", 2))),
                eos_token_ids=eos,
                pad_token_id=int(raw.get("pad_token_id", text.get("pad_token_id", 0)) or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(config_path, f"config.json lacks or mangles a field: {exc}") from None


def _find_token(tokens: list[str] | None, text: str) -> int | None:
    if tokens is None:
        return None
    try:
        return tokens.index(text)
    except ValueError:
        return None


def _gguf_query_pre_attn_scalar(
    meta: dict[str, Any], arch: str, hidden: int, heads: int, head_dim: int, layers: int
) -> float:
    """GGUF has no key for it; llama.cpp derives it: 27B (62 layers) uses hidden/heads, the rest head_dim."""
    if f"{arch}.attention.query_pre_attn_scalar" in meta:
        return float(meta[f"{arch}.attention.query_pre_attn_scalar"])
    return hidden / heads if layers == 62 else head_dim
