"""A chat with pictures -> prompt ids plus the soft tokens that replace the image placeholders.

`ImageSpan`s say where each picture's soft tokens sit in the prompt; the text model attends
bidirectionally within a span during prefill (engine/models/gemma3.py).

An image part may ask for pan-and-scan crops with `"pan_and_scan": True` (off by default, as in
the reference; engine/vision/images.py): each crop is then a picture of its own, with its own span
after the original's, and the prompt holds the processor's words around them (engine/chat.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from phoenix_chat.engine.chat import ImageLayout, count_images, is_image_part
from phoenix_chat.engine.errors import PhoenixError
from phoenix_chat.engine.vision.images import ImageError, ImageInput
from phoenix_chat.engine.vision.spans import ImageSpan

if TYPE_CHECKING:
    from phoenix_chat.engine.loader import LoadedModel


class NoImageInput(PhoenixError):
    """Pictures were sent to a text-only model."""


def has_images(prompt: object) -> bool:
    return isinstance(prompt, Sequence) and not isinstance(prompt, str) and count_images(prompt) > 0


@dataclass(frozen=True)
class ImagePart:
    """One image part of a chat: its picture, and whether it asks for pan-and-scan crops."""

    source: ImageInput
    pan_and_scan: bool = False


def image_parts(messages: Sequence[Mapping[str, Any]]) -> list[ImagePart]:
    """Each image part, in prompt order: `"image"` (a path or bytes) or `"path"`, and its
    `"pan_and_scan"` (true or false; absent: false)."""
    out: list[ImagePart] = []
    for msg in messages:
        content = msg.get("content")
        if isinstance(content, str) or not isinstance(content, Sequence):
            continue
        for item in content:
            if is_image_part(item):
                source = item.get("image", item.get("path"))
                if not isinstance(source, (str, bytes)) and not hasattr(source, "__fspath__"):
                    raise ImageError("an image part needs the picture as a path or bytes ('image' key)")
                pas = item.get("pan_and_scan", False)
                if not isinstance(pas, bool):
                    raise ImageError(f"an image part's 'pan_and_scan' must be true or false, not {pas!r}")
                out.append(ImagePart(source, pas))
    return out


def require_image_input(model: LoadedModel) -> None:
    if model.vision is None:
        raise NoImageInput(
            f"this model has no image input: {model.config.name} is a text-only model "
            "(pictures need a Gemma 3 4B, 12B or 27B multimodal model)"
        )


def encode_chat(model: LoadedModel, messages: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[ImageSpan]]:
    """Prompt ids with the image layout, and the spans with each picture's soft tokens."""
    require_image_input(model)
    assert model.vision is not None
    cfg = model.vision.cfg
    layout = ImageLayout(cfg.boi_token_id, cfg.eoi_token_id, cfg.image_token_id, cfg.mm_tokens_per_image)
    # bad pictures fail here, before any prefill; each picture's crops follow it
    per_part = [model.vision.encode_with_crops(p.source, p.pan_and_scan) for p in image_parts(messages)]
    encoded = [e for pictures in per_part for e in pictures]
    ids = model.chat.encode(messages, model.tokenizer, images=layout, crops=[len(p) - 1 for p in per_part])
    starts = [i for i, t in enumerate(ids) if t == cfg.image_token_id and (i == 0 or ids[i - 1] != t)]
    if len(starts) != len(encoded):
        raise PhoenixError(f"the prompt holds {len(starts)} image runs for {len(encoded)} pictures")
    return ids, [ImageSpan(s, emb, key) for s, (key, emb) in zip(starts, encoded, strict=True)]
