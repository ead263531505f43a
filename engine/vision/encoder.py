"""Pictures -> soft tokens: the SigLIP tower and the projector, with a cache per image.

The cache is keyed by the SHA-256 of the preprocessed pixel values, so regenerating an answer
or editing a later message does not run the tower again for a picture already seen (also when
the same picture comes from another path)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Protocol

import numpy as np

from phoenix_chat.engine.errors import ModelFileError
from phoenix_chat.engine.models.gemma3 import F32
from phoenix_chat.engine.models.siglip import SiglipVisionTower
from phoenix_chat.engine.vision.images import ImageInput, load_pixels, preprocess
from phoenix_chat.engine.vision.projector import project
from phoenix_chat.engine.vision_config import VisionConfig
from phoenix_chat.engine.weights.base import WeightSource

PROJECTION = "multi_modal_projector.mm_input_projection_weight"
SOFT_NORM = "multi_modal_projector.mm_soft_emb_norm.weight"
CACHED_IMAGES = 32  # soft tokens are small (256 x width f32: 2.5 MiB on the 4B)


class VisionTower(Protocol):
    """The tower + projector on a backend's device (Backend.vision_tower; Vulkan: siglip_graph.py)."""

    def encode(self, pixels: F32) -> F32: ...  # [3, size, size] -> [mm_tokens_per_image, text width]

    def encode_with_tower(self, pixels: F32) -> tuple[F32, F32]: ...  # + the tower's [patches, vision width]


class ImageEncoder:
    """The vision half of a multimodal model: on the CPU reference (numpy, f32), or on the
    device of the text model's backend where it has a tower there (`tower`)."""

    def __init__(self, weights: WeightSource, cfg: VisionConfig, tower: VisionTower | None = None) -> None:
        self.cfg = cfg
        self.device_tower = tower  # None: the numpy reference below
        projection = weights.vision_tensor(PROJECTION)
        if projection.shape != (cfg.hidden_size, cfg.text_hidden_size):
            raise ModelFileError(
                weights.path,
                f"{PROJECTION} has shape {projection.shape}, expected ({cfg.hidden_size}, {cfg.text_hidden_size})",
            )
        if tower is None:
            self.tower: SiglipVisionTower | None = SiglipVisionTower(cfg, weights.vision_tensor)
            self.norm_multiplier = weights.vision_tensor(SOFT_NORM) + np.float32(1.0)  # Gemma's RMSNorm: 1 + w
            self.projection = projection
        else:
            self.tower = None  # no second copy of the weights in RAM
        self._cache: OrderedDict[str, F32] = OrderedDict()
        self.tower_runs = 0  # how often the tower ran (cache misses): tests read it

    @staticmethod
    def key(pixels: F32) -> str:
        return hashlib.sha256(np.ascontiguousarray(pixels, np.float32).tobytes()).hexdigest()

    def _check(self, pixels: F32) -> None:
        size = self.cfg.image_size
        if pixels.shape != (3, size, size):
            raise ValueError(f"pixel values of shape {pixels.shape}, expected (3, {size}, {size})")

    def tower_output(self, pixels: F32) -> F32:
        """[patches, vision width] for one preprocessed picture [3, size, size]."""
        self._check(pixels)
        self.tower_runs += 1
        if self.device_tower is not None:
            return self.device_tower.encode_with_tower(pixels)[0]
        assert self.tower is not None
        return self.tower.forward(pixels)

    def soft_tokens(self, pixels: F32) -> tuple[str, F32]:
        """(cache key, [mm_tokens_per_image, text width]) for one preprocessed picture."""
        key = self.key(pixels)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return key, hit
        if self.device_tower is not None:  # the pool and projector run there too: only soft tokens come back
            self._check(pixels)
            self.tower_runs += 1
            tokens = self.device_tower.encode(pixels)
        else:
            tokens = project(self.tower_output(pixels), self.norm_multiplier, self.projection, self.cfg)
        self._cache[key] = tokens
        while len(self._cache) > CACHED_IMAGES:
            self._cache.popitem(last=False)
        return key, tokens

    def encode(self, source: ImageInput) -> tuple[str, F32]:
        """Decode (under the limits), preprocess and encode one picture."""
        return self.soft_tokens(load_pixels(source, self.cfg))

    def encode_with_crops(self, source: ImageInput, pan_and_scan: bool) -> list[tuple[str, F32]]:
        """The picture's (key, soft tokens), then each pan-and-scan crop's (none when off, or
        for a picture close to square): every crop is cached like a picture of its own."""
        return [self.soft_tokens(pixels) for pixels in preprocess(source, self.cfg, pan_and_scan)]
