"""Pan-and-scan crops (engine/vision/images.py), checked against transformers' goldens
(tools/make_vision_goldens.py, step 4) on the tiny random-weight Gemma3ForConditionalGeneration:
the settings are Gemma3Processor's, each test image gets transformers' number of crops, the wide
picture's crops have its pixel values, the prompt has the processor's ids (its words around the
original and the crops), the logits and greedy continuation are transformers', through
stream_generate and through the Scheduler; a picture close to square gets no crops, and with the
option off (or absent) everything is as before."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from phoenix_chat import engine
from phoenix_chat.engine.generate import encode_prompt, stream_generate
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler
from phoenix_chat.engine.vision.images import ImageError, PanAndScan, pan_and_scan_boxes, preprocess
from tools.tiny_vision_model import build

from .test_vision import GOLDENS, IMAGES, LOGIT_ATOL, PIXEL_ATOL, SOFT_ATOL

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def golden():
    data = np.load(GOLDENS / "transformers_vision.npz")
    return {k: data[k] for k in data.files}, json.loads((GOLDENS / "transformers_vision.json").read_text())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build(tmp_path_factory.mktemp("vision") / "tiny-gemma3-vision")


@pytest.fixture(scope="module")
def vision_model(folder):
    model = engine.load(folder, backend="cpu", context_length=256)
    yield model
    model.close()


def wide_chat(meta, pan_and_scan: bool | None, image: object = None) -> list[dict]:
    """The goldens' one-picture chat; `pan_and_scan` None: the part without the key."""
    part: dict = {"type": "image", "image": image or str(IMAGES / meta["pan_and_scan_chat"]["image"])}
    if pan_and_scan is not None:
        part["pan_and_scan"] = pan_and_scan
    text = meta["pan_and_scan_chat"]["chat"][0]["content"][1]
    return [{"role": "user", "content": [part, text]}]


def test_settings_are_the_processors(golden):
    _, meta = golden
    ours = PanAndScan()
    ref = meta["pan_and_scan_settings"]
    assert (ours.min_crop_size, ours.max_num_crops, ours.min_ratio_to_activate) == (
        ref["pan_and_scan_min_crop_size"],
        ref["pan_and_scan_max_num_crops"],
        ref["pan_and_scan_min_ratio_to_activate"],
    )


def test_each_test_image_gets_transformers_number_of_crops(golden, vision_model):
    _, meta = golden
    assert meta["pan_and_scan_num_crops"]["wide.png"] == 3
    for name, crops in meta["pan_and_scan_num_crops"].items():
        assert len(preprocess(IMAGES / name, vision_model.vision.cfg, pan_and_scan=True)) == 1 + crops, name


def test_crops_pixel_values_match_transformers(golden, vision_model):
    data, _ = golden
    ours = np.stack(preprocess(IMAGES / "wide.png", vision_model.vision.cfg, pan_and_scan=True))
    assert ours.shape == data["pas/pixels"].shape == (4, 3, 112, 112)
    np.testing.assert_allclose(ours, data["pas/pixels"], rtol=0, atol=PIXEL_ATOL)
    # the original comes first, as without pan-and-scan
    np.testing.assert_array_equal(ours[0], preprocess(IMAGES / "wide.png", vision_model.vision.cfg)[0])


def test_prompt_ids_match_the_processor(golden, vision_model):
    data, meta = golden
    ids, spans = encode_prompt(vision_model, wide_chat(meta, True))
    assert ids == data["pas/input_ids"].tolist()
    assert [s.start for s in spans] == meta["pan_and_scan_chat"]["image_starts"]
    types = np.zeros(len(ids), np.int64)
    for s in spans:
        types[s.start : s.end] = 1
    assert types.tolist() == data["pas/token_type_ids"].tolist()
    assert "Here is the original image" in meta["pan_and_scan_chat"]["text"]
    before = vision_model.tokenizer.decode(ids[: spans[0].start])
    assert before.endswith("Here is the original image \n\n<start_of_image>")


def test_logits_and_greedy_match_transformers(golden, vision_model):
    data, meta = golden
    ids, spans = encode_prompt(vision_model, wide_chat(meta, True))
    logits = vision_model.backend.forward_images(ids, 0, spans, all_logits=True)
    np.testing.assert_allclose(logits[-1], data["pas/logits_last"], rtol=0, atol=LOGIT_ATOL)
    starts = logits[[s.start for s in spans], : meta["logit_slice"]]
    np.testing.assert_allclose(starts, data["pas/logits_image_starts"], rtol=0, atol=LOGIT_ATOL)
    # the crops change what the model sees: the last position's logits are not the ones without them
    off_ids, off_spans = encode_prompt(vision_model, wide_chat(meta, False))
    off = vision_model.backend.forward_images(off_ids, 0, off_spans)
    assert np.abs(off[-1] - logits[-1]).max() > 1e-3
    steps = stream_generate(vision_model, wide_chat(meta, True), GREEDY, max_tokens=8)
    out = [r.token for r in steps if r.token is not None]
    assert out == data["pas/greedy"].tolist()


@pytest.mark.parametrize("pan_and_scan", [None, False], ids=["absent", "false"])
def test_off_leaves_the_prompt_as_before(golden, vision_model, pan_and_scan):
    data, meta = golden
    ids, spans = encode_prompt(vision_model, wide_chat(meta, pan_and_scan))
    assert ids == data["pas/input_ids_off"].tolist()
    assert len(spans) == 1
    np.testing.assert_allclose(spans[0].embeddings, data["soft/wide"], rtol=0, atol=SOFT_ATOL)


@pytest.mark.parametrize(("size", "crops"), [((600, 600), 0), ((700, 600), 0), ((720, 600), 2), ((600, 720), 2)])
def test_a_picture_close_to_square_gets_no_crops(golden, vision_model, tmp_path, size, crops):
    """Below the 1.2 ratio no crops, and the prompt is the one without pan-and-scan."""
    _, meta = golden
    path = tmp_path / "picture.png"
    Image.new("RGB", size, (200, 30, 90)).save(path)
    assert len(pan_and_scan_boxes(*size)) == crops
    ids, spans = encode_prompt(vision_model, wide_chat(meta, True, str(path)))
    off_ids, off_spans = encode_prompt(vision_model, wide_chat(meta, False, str(path)))
    assert len(spans) == 1 + crops and len(off_spans) == 1
    assert (ids == off_ids) == (not crops)
    assert spans[0].key == off_spans[0].key  # the original is preprocessed as without crops


def test_crop_boxes():
    """transformers' arithmetic: half-up rounding of the ratio, 2..4 crops, each >= 256 on its
    short side, the last one clipped to the picture."""
    assert pan_and_scan_boxes(900, 300) == [(0, 0, 300, 300), (300, 0, 600, 300), (600, 0, 900, 300)]
    assert len(pan_and_scan_boxes(3000, 300)) == 4  # 10:1, at most 4
    assert pan_and_scan_boxes(400, 100) == []  # crops of 200 x 100: under 256
    assert pan_and_scan_boxes(300, 1001) == [(0, 0, 300, 334), (0, 334, 300, 668), (0, 668, 300, 1001)]


def test_crops_are_cached_like_pictures(golden, vision_model):
    _, meta = golden
    encoder = vision_model.vision
    path = IMAGES / "wide.png"
    key = encoder.soft_tokens(preprocess(path, encoder.cfg, pan_and_scan=True)[2])[0]  # a crop alone first
    runs = encoder.tower_runs
    ids, spans = encode_prompt(vision_model, wide_chat(meta, True))
    assert encoder.tower_runs <= runs + 3 and spans[2].key == key
    runs = encoder.tower_runs
    encode_prompt(vision_model, wide_chat(meta, True))  # regenerate: the picture and its crops are cached
    assert encoder.tower_runs == runs


def test_a_non_boolean_setting_is_refused_in_one_line(golden, vision_model):
    _, meta = golden
    with pytest.raises(ImageError, match="'pan_and_scan' must be true or false") as info:
        part = {"type": "image", "image": str(IMAGES / "gray.png"), "pan_and_scan": "yes"}
        encode_prompt(vision_model, [{"role": "user", "content": [part]}])
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("slots", [1, 2])
def test_scheduler_answer_with_crops_is_transformers(golden, folder, slots):
    """Through the Scheduler (the server's and the GUI's path): transformers' greedy answer with
    pan-and-scan, and the prompt has the crops' tokens (113, against 33 without)."""
    data, meta = golden
    model = engine.load(folder, backend="cpu", context_length=256, slots=slots)
    scheduler = Scheduler(model)
    try:
        deltas = list(scheduler.submit(Request(wide_chat(meta, True), GREEDY, 8)))
        off = list(scheduler.submit(Request(wide_chat(meta, False), GREEDY, 8)))
    finally:
        scheduler.close()
        model.close()
    assert deltas[-1].finish_reason == "length", deltas[-1].error
    assert [t for d in deltas for t in d.token_ids] == data["pas/greedy"].tolist()
    assert deltas[-1].usage.prompt_tokens == len(data["pas/input_ids"]) == 113
    assert off[-1].usage.prompt_tokens == len(data["pas/input_ids_off"]) == 33


# ---- the CLI ------------------------------------------------------------------------------


def test_cli_run_pan_and_scan_gives_transformers_prompt_and_answer(golden, folder, vision_model):
    """`run --image wide.png --pan-and-scan`: the goldens' chat (picture, then the text), so the
    prompt is the processor's 113 ids and the answer the engine's greedy one with crops; without
    the flag the 33 ids of the picture alone."""
    from .test_cli import cli

    data, meta = golden
    text = meta["pan_and_scan_chat"]["chat"][0]["content"][1]["text"]
    args = ("--model", str(folder), "--backend", "cpu", "--temperature", "0", "--max-tokens", "8")
    wide = str(IMAGES / "wide.png")
    on = cli("run", text, *args, "--image", wide, "--pan-and-scan")
    assert on.returncode == 0, on.stderr
    off = cli("run", text, *args, "--image", wide)
    assert off.returncode == 0, off.stderr
    expected = "".join(r.text for r in stream_generate(vision_model, wide_chat(meta, True), GREEDY, max_tokens=8))
    assert on.stdout == expected + "\n"
    assert f"prompt {len(data['pas/input_ids'])} tok" in on.stderr
    assert f"prompt {len(data['pas/input_ids_off'])} tok" in off.stderr


def test_cli_pan_and_scan_needs_a_picture():
    from .test_cli import cli

    proc = cli("run", "hi", "--pan-and-scan")
    assert proc.returncode == 2 and "--pan-and-scan crops pictures: give one with --image" in proc.stderr
