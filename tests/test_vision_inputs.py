"""Pictures that cannot be used get one clear line each, before any compute: truncated files,
decompression bombs, files that are no picture (or a format we do not read), missing files,
oversized files; and the CLI's `run --image` reaches the model (or says the model has none)."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from phoenix_chat.engine.vision import images
from phoenix_chat.engine.vision.images import ImageError, load_pixels, open_image
from phoenix_chat.engine.vision_config import VisionConfig

from .test_cli import cli

IMAGES = Path(__file__).parent / "goldens" / "vision_images"
CFG = VisionConfig(image_size=112)


def png_header(width: int, height: int) -> bytes:
    """A PNG that claims width x height pixels in a few dozen bytes (how bombs start)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.mark.parametrize("name", ["portrait_rgba.png", "exif_rotated.jpg", "small.webp"])
def test_truncated_file_is_refused(tmp_path, name):
    data = (IMAGES / name).read_bytes()
    cut = tmp_path / name
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageError, match="damaged or truncated|unreadable"):
        load_pixels(cut, CFG)


@pytest.mark.parametrize(
    ("width", "height", "why"),
    [(100_000, 100_000, "decompression bomb"), (9_000, 9_000, "over the limit of 64 megapixels")],
)
def test_decompression_bomb_is_refused_from_its_header(width, height, why):
    with pytest.raises(ImageError, match=why):
        open_image(png_header(width, height))


def test_not_an_image_and_unsupported_formats_are_refused(tmp_path):
    text = tmp_path / "notes.png"
    text.write_text("not a picture at all")
    with pytest.raises(ImageError, match=r"notes.png: not an image Phoenix Chat reads \(PNG, JPEG, WEBP, GIF\)"):
        load_pixels(text, CFG)
    bmp = tmp_path / "old.bmp"
    open_image(IMAGES / "gray.png").save(bmp)
    with pytest.raises(ImageError, match="not an image Phoenix Chat reads"):
        load_pixels(bmp, CFG)


def test_missing_and_oversized_files_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ImageError, match="no such image file"):
        load_pixels(tmp_path / "gone.png", CFG)
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 1000)
    with pytest.raises(ImageError, match="MiB image limit"):
        load_pixels(IMAGES / "portrait_rgba.png", CFG)  # 3.8 KB


def test_gif_uses_its_first_frame():
    from PIL import Image

    with Image.open(IMAGES / "two_frames.gif") as gif:
        first = gif.convert("RGB").tobytes()
        gif.seek(1)
        second = gif.convert("RGB").tobytes()
    assert first != second
    assert open_image(IMAGES / "two_frames.gif").tobytes() == first


# ---- the CLI ------------------------------------------------------------------------------


def test_cli_run_image_on_the_text_only_270m_says_it_has_no_image_input():
    proc = cli("run", "What is in the picture?", "--backend", "cpu", "--image", str(IMAGES / "gray.png"))
    assert proc.returncode == 2, proc.stderr
    assert "this model has no image input" in proc.stderr
    assert proc.stdout == ""


def test_cli_run_image_refuses_raw_and_bad_pictures(tmp_path):
    proc = cli("run", "hi", "--raw", "--image", str(IMAGES / "gray.png"))
    assert proc.returncode == 2 and "--image needs the chat format" in proc.stderr
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"GIF89a-but-not-really")
    folder = _tiny_folder(tmp_path)
    proc = cli("run", "hi", "--model", str(folder), "--backend", "cpu", "--image", str(bad))
    assert proc.returncode == 2 and "bad.jpg: not an image" in proc.stderr


def _tiny_folder(tmp_path: Path) -> Path:
    from tools.tiny_vision_model import build

    return build(tmp_path / "tiny-gemma3-vision")


def test_cli_run_images_reach_the_model(tmp_path):
    """`--image A --image B`: the answer is the engine's for [A, B, text] (the engine's is checked
    against transformers in test_vision.py), differs when the pictures differ, and the prompt
    holds both pictures' 16 soft tokens."""
    from phoenix_chat import engine
    from phoenix_chat.engine.generate import encode_prompt, stream_generate
    from phoenix_chat.engine.sampling import SamplingParams

    folder = _tiny_folder(tmp_path)
    a, b, c = (str(IMAGES / n) for n in ("exif_rotated.jpg", "portrait_rgba.png", "gray.png"))
    args = ("--model", str(folder), "--backend", "cpu", "--temperature", "0", "--max-tokens", "6")
    proc = cli("run", "Compare them.", *args, "--image", a, "--image", b)
    assert proc.returncode == 0, proc.stderr
    other = cli("run", "Compare them.", *args, "--image", a, "--image", c)
    assert other.returncode == 0, other.stderr

    model = engine.load(folder, backend="cpu", context_length=256)
    chat = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": a},
                {"type": "image", "image": b},
                {"type": "text", "text": "Compare them."},
            ],
        }
    ]
    expected = "".join(r.text for r in stream_generate(model, chat, SamplingParams(temperature=0.0), max_tokens=6))
    ids, spans = encode_prompt(model, chat)
    assert [s.end - s.start for s in spans] == [16, 16]
    assert proc.stdout == expected + "\n"
    assert f"prompt {len(ids)} tok" in proc.stderr
    assert other.stdout != proc.stdout


def test_cli_info_says_whether_a_model_takes_images(tmp_path):
    folder = _tiny_folder(tmp_path)
    proc = cli("info", "--model", str(folder))
    assert proc.returncode == 0, proc.stderr
    assert "image input:    yes: SigLIP 112 px, patch 14, 2 layers, width 32, 16 tokens per image" in proc.stdout
    assert json.loads(cli("info", "--model", str(folder), "--json").stdout)["image_input"].startswith("yes")
    assert json.loads(cli("info", "--json").stdout)["image_input"] is None  # the embedded 270M
