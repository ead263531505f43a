"""The model file a bench runs on: `--model PATH`, a synthetic Gemma-3-shaped Q4_0 file (Q8_0
embedding) written once into the work folder, or the embedded 270M."""

from __future__ import annotations

from pathlib import Path


def model_file(model: str | None, synthetic: str | None, workdir: str) -> Path:
    """The synthetic shape wins where given; its file is reused across runs (a 27B takes minutes)."""
    if synthetic:
        from tools.make_synthetic_gguf import write

        path = Path(workdir) / f"synthetic-{synthetic}-q4_0.gguf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write(path, synthetic, "q4_0", "q8_0")
        return path
    from phoenix_chat.engine.weights import embedded_model_path

    return Path(model) if model else embedded_model_path()
