"""Goldens for image input, made by transformers (run in a tools-only venv with torch):

    /work/toolsvenv/bin/python tools/make_vision_goldens.py [--python .venv/bin/python]

(that venv: `python3.11 -m venv /work/toolsvenv`, then pip install the CPU wheel of torch 2.13.0,
transformers==5.24.0 and Pillow 13.0.0, the project's Pillow: the resize must be the same code)

1. the project's python builds the tiny checkpoint (tools/tiny_vision_model.py, numpy, seeded)
   into a temporary folder;
2. this script writes the test images (Pillow, fixed pixels: odd sizes, an EXIF-rotated JPEG,
   a portrait RGBA PNG, a grayscale PNG, a two-frame GIF, a WebP) to tests/goldens/vision_images/;
3. transformers loads the folder as `Gemma3ForConditionalGeneration` (f32, eager attention;
   a missing or unexpected parameter is an error) and records, in
   tests/goldens/transformers_vision.npz (+ .json): each image's pixel values (transformers'
   `load_image` + the PIL-backend `Gemma3ImageProcessorPil`), the vision tower's output, the
   projected soft tokens, and for a chat with two images: the prompt ids the processor and chat
   template make, logits at each image's first soft token and at the last position, and the
   greedy continuation;
4. pan-and-scan (`do_pan_and_scan=True` at the processor's call, its other settings Gemma3Processor's
   own defaults, recorded in the .json): how many crops each test image gets, and for a one-image
   chat with the wide picture (900 x 300): the pixel values of the original and every crop, the
   prompt ids (the processor's "Here is the original image ... and here are some crops ..." text),
   token types, logits at each picture's first soft token and at the last position, the greedy
   continuation, and the same chat's ids with pan-and-scan off.
Nothing else writes those files.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
GOLDENS = ROOT / "tests" / "goldens"
IMAGES = GOLDENS / "vision_images"
PROMPT_TEXT = ("What is in this picture?", "And how does this one differ?")
PAS_IMAGE = "wide.png"
PAS_TEXT = "Describe this wide picture."
GREEDY_TOKENS = 8
LOGIT_SLICE = 8192  # vocabulary rows kept at the image positions (the last position keeps all)


def _pattern(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), (x + y) * 255 // max(w + h - 2, 1)], -1)
    return np.clip(base + rng.integers(-40, 40, (h, w, 3)), 0, 255).astype(np.uint8)


def write_images() -> list[Path]:
    IMAGES.mkdir(parents=True, exist_ok=True)
    paths = []
    # a landscape photo whose EXIF says "rotate 90 degrees clockwise to view" (orientation 6)
    jpg = Image.fromarray(_pattern(45, 30, 1))
    exif = Image.Exif()
    exif[0x0112] = 6
    path = IMAGES / "exif_rotated.jpg"
    jpg.save(path, quality=90, exif=exif.tobytes())
    paths.append(path)
    rgba = np.concatenate([_pattern(23, 51, 2), np.linspace(0, 255, 23 * 51).reshape(51, 23, 1).astype(np.uint8)], -1)
    path = IMAGES / "portrait_rgba.png"
    Image.fromarray(rgba, "RGBA").save(path)
    paths.append(path)
    path = IMAGES / "gray.png"
    Image.fromarray(_pattern(37, 29, 3)[..., 0], "L").save(path)
    paths.append(path)
    frames = [Image.fromarray(_pattern(40, 20, s)).convert("P") for s in (4, 5)]
    path = IMAGES / "two_frames.gif"
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=100)
    paths.append(path)
    path = IMAGES / "small.webp"
    Image.fromarray(_pattern(17, 9, 6)).save(path, lossless=True)
    paths.append(path)
    path = IMAGES / PAS_IMAGE  # 3:1, wide enough for three pan-and-scan crops of 300 x 300
    Image.fromarray(_pattern(900, 300, 7)).save(path)
    paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"), help="the project's venv")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.image_utils import load_image
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    torch.manual_seed(0)
    paths = write_images()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny-gemma3-vision"
        subprocess.run([args.python, "-m", "tools.tiny_vision_model", str(folder)], cwd=ROOT, check=True)
        model, info = Gemma3ForConditionalGeneration.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
        )
        bad = {k: v for k, v in info.items() if v and k != "mismatched_keys" or (k == "mismatched_keys" and v)}
        if bad:
            raise SystemExit(f"the tiny checkpoint does not match transformers' model: {bad}")
        model.eval()
        cfg = json.loads((folder / "preprocessor_config.json").read_text())
        size = cfg["size"]
        image_processor = Gemma3ImageProcessorPil(size=size, do_pan_and_scan=False)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        processor = Gemma3Processor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
            image_seq_length=model.config.mm_tokens_per_image,
        )

        out: dict[str, np.ndarray] = {}
        meta: dict[str, object] = {
            "transformers": __import__("transformers").__version__,
            "torch": torch.__version__,
            "image_processor": "Gemma3ImageProcessorPil (PIL bilinear resize, rescale 1/255, normalize 0.5/0.5)",
            "images": [p.name for p in paths],
            "image_size": size,
        }
        pil_images = [load_image(str(p)) for p in paths]  # EXIF transpose + RGB, as transformers does
        meta["loaded_sizes"] = [list(im.size) for im in pil_images]
        with torch.no_grad():
            for p, im in zip(paths, pil_images, strict=True):
                pixels = image_processor(im, return_tensors="pt")["pixel_values"]
                tower = model.model.vision_tower(pixel_values=pixels).last_hidden_state
                soft = model.model.multi_modal_projector(tower)
                key = p.stem
                out[f"pixels/{key}"] = pixels[0].numpy()
                out[f"tower/{key}"] = tower[0].numpy()
                out[f"soft/{key}"] = soft[0].numpy()

            chat = [
                {
                    "role": "user",
                    "content": [
                        {"type": "image"},
                        {"type": "text", "text": PROMPT_TEXT[0]},
                        {"type": "image"},
                        {"type": "text", "text": PROMPT_TEXT[1]},
                    ],
                }
            ]
            text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            chat_images = [pil_images[0], pil_images[1]]
            inputs = processor(text=text, images=chat_images, return_tensors="pt")
            ids = inputs["input_ids"][0]
            logits = model(**inputs).logits[0]
            firsts = [
                int(i)
                for i in range(len(ids))
                if ids[i] == model.config.image_token_id and (i == 0 or ids[i - 1] != model.config.image_token_id)
            ]
            generated = model.generate(**inputs, do_sample=False, max_new_tokens=GREEDY_TOKENS)
            new = generated[0, len(ids) :].tolist()
            last = logits[-1].numpy()
            top2 = np.sort(last)[-2:]
            out["chat/input_ids"] = ids.numpy().astype(np.int64)
            out["chat/token_type_ids"] = inputs["token_type_ids"][0].numpy().astype(np.int64)
            out["chat/logits_last"] = last
            out["chat/logits_image_starts"] = logits[firsts, :LOGIT_SLICE].numpy()
            out["chat/greedy"] = np.asarray(new, np.int64)
            meta.update(
                {
                    "chat": chat,
                    "chat_images": [paths[0].name, paths[1].name],
                    "chat_text": text,
                    "image_starts": firsts,
                    "greedy": new,
                    "last_top2_margin": float(top2[1] - top2[0]),
                    "logit_slice": LOGIT_SLICE,
                }
            )
            pan_and_scan(model, processor, image_processor, paths, pil_images, out, meta)
    np.savez_compressed(GOLDENS / "transformers_vision.npz", **out)
    (GOLDENS / "transformers_vision.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps({k: v for k, v in meta.items() if k != "chat_text"}, indent=1))


def pan_and_scan(
    model: Any,
    processor: Any,
    image_processor: Any,
    paths: list[Path],
    pil_images: list[Any],
    out: dict[str, np.ndarray],
    meta: dict[str, Any],
) -> None:
    """Step 4 of the module doc (under torch.no_grad)."""
    defaults = {k: v for k, v in type(processor).images_kwargs.items() if k.startswith("pan_and_scan")}
    meta["pan_and_scan_settings"] = defaults
    meta["pan_and_scan_num_crops"] = {
        p.name: int(image_processor(im, do_pan_and_scan=True, **defaults)["num_crops"][0])
        for p, im in zip(paths, pil_images, strict=True)
    }
    wide = pil_images[[p.name for p in paths].index(PAS_IMAGE)]
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PAS_TEXT}]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    off = processor(text=text, images=[wide], return_tensors="pt")
    inputs = processor(text=text, images=[wide], do_pan_and_scan=True, return_tensors="pt")
    inputs.pop("num_crops", None)  # the processor's bookkeeping, not a model input
    ids = inputs["input_ids"][0]
    image_id = model.config.image_token_id
    firsts = [int(i) for i in range(len(ids)) if ids[i] == image_id and (i == 0 or ids[i - 1] != image_id)]
    logits = model(**inputs).logits[0]
    generated = model.generate(**inputs, do_sample=False, max_new_tokens=GREEDY_TOKENS)
    new = generated[0, len(ids) :].tolist()
    last = logits[-1].numpy()
    top2 = np.sort(last)[-2:]
    out["pas/pixels"] = inputs["pixel_values"].numpy()
    out["pas/input_ids"] = ids.numpy().astype(np.int64)
    out["pas/input_ids_off"] = off["input_ids"][0].numpy().astype(np.int64)
    out["pas/token_type_ids"] = inputs["token_type_ids"][0].numpy().astype(np.int64)
    out["pas/logits_last"] = last
    out["pas/logits_image_starts"] = logits[firsts, :LOGIT_SLICE].numpy()
    out["pas/greedy"] = np.asarray(new, np.int64)
    meta["pan_and_scan_chat"] = {
        "chat": chat,
        "image": PAS_IMAGE,
        "text": processor.tokenizer.decode(ids),
        "image_starts": firsts,
        "greedy": new,
        "last_top2_margin": float(top2[1] - top2[0]),
    }


if __name__ == "__main__":
    sys.exit(main())
