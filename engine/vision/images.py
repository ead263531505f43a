"""Pictures in, pixel values out: decoding with Pillow under limits, then Gemma 3's processor.

Decoding: PNG, JPEG, WebP and GIF (its first frame) only; the file at most `MAX_IMAGE_BYTES`
and the picture at most `MAX_IMAGE_PIXELS` (checked from the header, before any pixel is
decompressed: a few-KB PNG can claim 100,000 x 100,000 pixels); a truncated or unreadable file
is an `ImageError` with one line saying which. Then, as transformers' `load_image` does: the
EXIF orientation applied and the picture converted to RGB (alpha dropped, grayscale repeated).

Preprocessing (`Gemma3ImageProcessor`'s settings): a bilinear resize to image_size x image_size,
rescale by 1/255, normalize with mean = std = 0.5, channels first.

Pan-and-scan (off by default, as in the reference; `preprocess(..., pan_and_scan=True)`): a picture
at least 1.2 times wider than tall (or taller than wide) is also cut into 2 to 4 equal crops along
its long side, each at least 256 pixels on its short side, and every crop is preprocessed like a
picture of its own, after the original (transformers' `Gemma3ImageProcessor.pan_and_scan` with
`Gemma3Processor`'s defaults, which take precedence over preprocessor_config.json's).
"""

from __future__ import annotations

import io
import itertools
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
from PIL import Image, ImageOps, UnidentifiedImageError

from phoenix_chat.engine.errors import PhoenixError
from phoenix_chat.engine.vision_config import VisionConfig

# a path to a picture, or its bytes (a paste, an upload)
ImageInput: TypeAlias = str | os.PathLike[str] | bytes

FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
MAX_IMAGE_BYTES = 64 * 1024 * 1024
MAX_IMAGE_PIXELS = 64_000_000  # a 64-megapixel photo is fine; the bombs claim far more


class ImageError(PhoenixError):
    """A picture that cannot be used: not an image, a format we do not read, truncated, too big."""


def describe(source: ImageInput) -> str:
    """How an error names the picture."""
    return f"{len(source)}-byte image" if isinstance(source, bytes) else str(Path(source))


def open_image(source: ImageInput) -> Image.Image:
    """The picture as an RGB Pillow image, upright per its EXIF orientation (first frame of a GIF)."""
    name = describe(source)
    data = source if isinstance(source, bytes) else _read(Path(source))
    try:
        with warnings.catch_warnings():  # Pillow only warns between its two limits: refuse there too
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not an image Phoenix Chat reads ({', '.join(FORMATS)})") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageError(f"{name}: refused as a decompression bomb ({exc})") from None
    except OSError as exc:
        raise ImageError(f"{name}: unreadable image ({exc})") from None
    width, height = img.size
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(
            f"{name}: {width} x {height} pixels is over the limit of {MAX_IMAGE_PIXELS // 1_000_000} megapixels "
            "(a decompression bomb, or a picture to scale down first)"
        )
    try:
        img.seek(0)
        img.load()
        upright = ImageOps.exif_transpose(img)
        return upright.convert("RGB")
    except (OSError, SyntaxError, ValueError) as exc:  # Pillow reports truncation and corrupt data so
        raise ImageError(f"{name}: damaged or truncated image ({exc})") from None


def _read(path: Path) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_IMAGE_BYTES:
            raise ImageError(f"{path}: {size / 2**20:.0f} MiB is over the {MAX_IMAGE_BYTES // 2**20} MiB image limit")
        return path.read_bytes()
    except FileNotFoundError:
        raise ImageError(f"{path}: no such image file") from None
    except IsADirectoryError:
        raise ImageError(f"{path}: a folder, not an image") from None
    except PermissionError:
        raise ImageError(f"{path}: not readable (permission denied)") from None


def pixel_values(img: Image.Image, cfg: VisionConfig) -> npt.NDArray[np.float32]:
    """[3, size, size] f32: Gemma 3's processor (bilinear resize, rescale, normalize)."""
    size = cfg.image_size
    resized = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    x = np.asarray(resized, dtype=np.float32) * np.float32(cfg.rescale_factor)
    mean = np.asarray(cfg.image_mean, np.float32)
    std = np.asarray(cfg.image_std, np.float32)
    return np.ascontiguousarray(((x - mean) / std).transpose(2, 0, 1), dtype=np.float32)


def load_pixels(source: ImageInput, cfg: VisionConfig) -> npt.NDArray[np.float32]:
    """Decode (under the limits) and preprocess one picture."""
    return pixel_values(open_image(source), cfg)


@dataclass(frozen=True)
class PanAndScan:
    """Pan-and-scan's settings: Gemma3Processor's defaults (its `images_kwargs`)."""

    min_crop_size: int = 256
    max_num_crops: int = 4
    min_ratio_to_activate: float = 1.2


def pan_and_scan_boxes(width: int, height: int, pas: PanAndScan = PanAndScan()) -> list[tuple[int, int, int, int]]:
    """The crops' (left, top, right, bottom) boxes, row by row; none for a picture close to
    square or too small to give crops of `min_crop_size` (transformers' arithmetic exactly)."""
    if width >= height:
        if width / height < pas.min_ratio_to_activate:
            return []
        across = min(math.floor(width / pas.min_crop_size), math.floor(width / height + 0.5))
        across, down = min(pas.max_num_crops, max(2, across)), 1
    else:
        if height / width < pas.min_ratio_to_activate:
            return []
        down = min(math.floor(height / pas.min_crop_size), math.floor(height / width + 0.5))
        across, down = 1, min(pas.max_num_crops, max(2, down))
    crop_w, crop_h = math.ceil(width / across), math.ceil(height / down)
    if min(crop_w, crop_h) < pas.min_crop_size:
        return []
    # clipped to the picture as a numpy slice is (Pillow's crop would pad past the edge with black)
    return [
        (x, y, min(x + crop_w, width), min(y + crop_h, height))
        for y, x in itertools.product(range(0, down * crop_h, crop_h), range(0, across * crop_w, crop_w))
    ]


def preprocess(source: ImageInput, cfg: VisionConfig, pan_and_scan: bool = False) -> list[npt.NDArray[np.float32]]:
    """Decode once; the picture's pixel values, then (with `pan_and_scan`) each crop's."""
    img = open_image(source)
    crops = [img.crop(box) for box in pan_and_scan_boxes(*img.size)] if pan_and_scan else []
    return [pixel_values(im, cfg) for im in (img, *crops)]
