"""Pictures a user attaches to a message (no Qt here).

A picture is checked when it is attached, by the engine's own decoder
(`engine/vision/images.py`: the formats it reads, the size and decompression-bomb limits, a
truncated file), so a bad file is refused at once with the engine's one-line reason instead of
when the answer starts. What is kept is the file's own bytes (the model reads those, as the
engine decodes them again) plus a small PNG thumbnail made from the upright picture, so the
chat view and a restart never decode a large picture again.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from phoenix_chat.engine.vision.images import FORMATS, ImageError, open_image

THUMBNAIL_PX = 160  # the long side of a thumbnail
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
EXTENSIONS = {"PNG": "png", "JPEG": "jpg", "WEBP": "webp", "GIF": "gif"}


@dataclass(frozen=True)
class Picture:
    """One attached picture: the file's bytes as given, and what the app shows of it."""

    name: str  # the file's name, or "pasted image.png"
    format: str  # one of engine.vision.images.FORMATS
    data: bytes
    width: int  # upright (EXIF orientation applied), as the model sees it
    height: int
    thumbnail: bytes  # PNG, at most THUMBNAIL_PX on the long side

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.format]


def read_picture(path: str | Path) -> Picture:
    """A picture file, checked as the engine will read it (ImageError: one line, why not)."""
    path = Path(path)
    upright = open_image(path)  # the size limit is checked before the file is read
    return _picture(path.name, path.read_bytes(), upright)


def picture_from_bytes(data: bytes, name: str) -> Picture:
    """A picture given as bytes (pasted from the clipboard), checked as the engine will read it."""
    return _picture(name, data, open_image(data))


def media_type(data: bytes, name: str = "picture") -> str:
    """The picture's media type ("image/png", ...) from its header (ImageError when it is none we read)."""
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:
            fmt = img.format
    except (OSError, ValueError):
        fmt = None
    if fmt not in MEDIA_TYPES:
        raise ImageError(f"{name}: not an image Phoenix Chat reads ({', '.join(FORMATS)})")
    return MEDIA_TYPES[fmt]


def _picture(name: str, data: bytes, upright: Image.Image) -> Picture:
    fmt = {media: f for f, media in MEDIA_TYPES.items()}[media_type(data, name)]
    thumb = upright.copy()
    thumb.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    thumb.save(out, format="PNG")
    return Picture(name, fmt, data, upright.width, upright.height, out.getvalue())
