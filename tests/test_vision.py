"""Image input on the CPU reference, checked against transformers' goldens
(tools/make_vision_goldens.py) on a tiny random-weight Gemma3ForConditionalGeneration that
tools/tiny_vision_model.py rebuilds here bit for bit (numpy, seeded; the goldens were made from
the same folder). The real embedded 270M (text-only) must refuse pictures clearly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phoenix_chat import engine
from phoenix_chat.engine.backends.base import image_chunks
from phoenix_chat.engine.generate import encode_prompt, stream_generate
from phoenix_chat.engine.prompt_cache import PromptCache
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.vision.images import load_pixels
from phoenix_chat.engine.vision.prompt import NoImageInput
from phoenix_chat.engine.vision.spans import ImageSpan
from tools.tiny_vision_model import build

GOLDENS = Path(__file__).parent / "goldens"
IMAGES = GOLDENS / "vision_images"

# f32 on both sides; the differences are summation order (numpy vs torch). Measured max abs
# differences: pixels 1.2e-7, tower 3.2e-6 (values ~3), soft tokens 2.4e-6 (~3.7), logits 3.4e-6 (~3.6)
PIXEL_ATOL = 1e-6  # pixel values are k/127.5 - 1 for integer k: only rounding differs
TOWER_ATOL = 2e-5
SOFT_ATOL = 2e-5
LOGIT_ATOL = 2e-5


@pytest.fixture(scope="module")
def golden():
    data = np.load(GOLDENS / "transformers_vision.npz")
    meta = json.loads((GOLDENS / "transformers_vision.json").read_text())
    return {k: data[k] for k in data.files}, meta


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    folder = build(tmp_path_factory.mktemp("vision") / "tiny-gemma3-vision")
    model = engine.load(folder, backend="cpu", context_length=256)
    yield model
    model.close()


def chat_with_images(meta):
    """The goldens' two-picture chat with the pictures as paths."""
    paths = iter(IMAGES / name for name in meta["chat_images"])
    content = [
        {"type": "image", "image": str(next(paths))} if item["type"] == "image" else item
        for item in meta["chat"][0]["content"]
    ]
    return [{"role": "user", "content": content}]


@pytest.mark.parametrize("name", ["exif_rotated.jpg", "portrait_rgba.png", "gray.png", "two_frames.gif", "small.webp"])
def test_pixel_values_match_transformers(golden, vision_model, name):
    data, _ = golden
    ours = load_pixels(IMAGES / name, vision_model.vision.cfg)
    ref = data[f"pixels/{Path(name).stem}"]
    assert ours.shape == ref.shape == (3, 112, 112)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=PIXEL_ATOL)


def test_exif_orientation_is_applied(vision_model):
    from phoenix_chat.engine.vision.images import open_image

    assert open_image(IMAGES / "exif_rotated.jpg").size == (30, 45)  # stored 45 x 30, EXIF says rotate


@pytest.mark.parametrize("name", ["exif_rotated", "portrait_rgba", "gray", "two_frames", "small"])
def test_vision_tower_and_soft_tokens_match_transformers(golden, vision_model, name):
    data, _ = golden
    encoder = vision_model.vision
    tower = encoder.tower_output(data[f"pixels/{name}"])
    np.testing.assert_allclose(tower, data[f"tower/{name}"], rtol=0, atol=TOWER_ATOL)
    _, soft = encoder.soft_tokens(data[f"pixels/{name}"])
    assert soft.shape == (16, 64)
    np.testing.assert_allclose(soft, data[f"soft/{name}"], rtol=0, atol=SOFT_ATOL)


def test_prompt_layout_matches_the_processor(golden, vision_model):
    data, meta = golden
    ids, spans = encode_prompt(vision_model, chat_with_images(meta))
    assert ids == data["chat/input_ids"].tolist()
    assert [s.start for s in spans] == meta["image_starts"]
    # the token types transformers derives its bidirectional blocks from: 1 exactly on our spans
    types = np.zeros(len(ids), np.int64)
    for s in spans:
        types[s.start : s.end] = 1
    assert types.tolist() == data["chat/token_type_ids"].tolist()


def test_image_chat_logits_match_transformers(golden, vision_model):
    data, meta = golden
    ids, spans = encode_prompt(vision_model, chat_with_images(meta))
    logits = vision_model.backend.forward_images(ids, 0, spans, all_logits=True)
    np.testing.assert_allclose(logits[-1], data["chat/logits_last"], rtol=0, atol=LOGIT_ATOL)
    # each picture's first soft token sees its whole picture (bidirectional), not only itself
    starts = logits[meta["image_starts"], : meta["logit_slice"]]
    np.testing.assert_allclose(starts, data["chat/logits_image_starts"], rtol=0, atol=LOGIT_ATOL)


def test_image_chat_greedy_continuation_equals_transformers(golden, vision_model):
    data, meta = golden
    out = [
        r.token
        for r in stream_generate(vision_model, chat_with_images(meta), SamplingParams(temperature=0.0), max_tokens=8)
        if r.token is not None
    ]
    assert out == data["chat/greedy"].tolist()


def test_each_picture_is_encoded_once(golden, vision_model):
    _, meta = golden
    encoder = vision_model.vision
    chat = chat_with_images(meta)
    encode_prompt(vision_model, chat)
    runs = encoder.tower_runs
    encode_prompt(vision_model, chat)  # regenerate: both pictures come from the cache
    assert encoder.tower_runs == runs
    same_bytes = [{"role": "user", "content": [{"type": "image", "image": (IMAGES / "gray.png").read_bytes()}]}]
    encode_prompt(vision_model, same_bytes)
    assert encoder.tower_runs == runs + 1  # a new picture runs the tower
    encode_prompt(vision_model, [{"role": "user", "content": [{"type": "image", "image": str(IMAGES / "gray.png")}]}])
    assert encoder.tower_runs == runs + 1  # the same pixels from a path: cached by content


def test_prefix_reuse_tells_pictures_apart(golden, vision_model):
    _, meta = golden
    chat = chat_with_images(meta)
    cache = PromptCache(vision_model.backend)
    greedy = SamplingParams(temperature=0.0)
    first = list(stream_generate(vision_model, chat, greedy, max_tokens=2, cache=cache))
    assert first[-1].prompt_reused == 0
    ids, spans = encode_prompt(vision_model, chat)
    assert cache.plan(ids, spans).reused == len(ids) - 1  # the same pictures: all but the last id
    swapped = [dict(chat[0], content=list(chat[0]["content"]))]
    swapped[0]["content"][2] = {"type": "image", "image": str(IMAGES / "gray.png")}
    ids2, spans2 = encode_prompt(vision_model, swapped)
    assert ids2 == ids  # the same token ids ...
    assert cache.plan(ids2, spans2).reused == spans2[1].start  # ... but the second picture differs
    # and the answer after reuse is the answer from scratch
    reused = [r.token for r in stream_generate(vision_model, swapped, greedy, max_tokens=4, cache=cache)]
    fresh = [r.token for r in stream_generate(vision_model, swapped, greedy, max_tokens=4)]
    assert reused == fresh


def test_prefill_chunks_never_cut_a_picture():
    span = ImageSpan(5, np.zeros((16, 4), np.float32), "k")
    assert image_chunks(40, 0, [span], 10) == [(0, 5), (5, 21), (21, 31), (31, 40)]
    assert image_chunks(40, 0, [span], 30) == [(0, 30), (30, 40)]
    assert image_chunks(30, 5, [span], 8) == [(0, 16), (16, 24), (24, 30)]


def test_prefill_in_small_chunks_gives_the_same_logits(golden, vision_model, monkeypatch):
    data, meta = golden
    import phoenix_chat.engine.backends.cpu as cpu

    monkeypatch.setattr(cpu, "PREFILL_CHUNK", 7)  # shorter than a picture: its chunk grows to hold it
    ids, spans = encode_prompt(vision_model, chat_with_images(meta))
    logits = vision_model.backend.forward_images(ids, 0, spans)
    np.testing.assert_allclose(logits, data["chat/logits_last"], rtol=0, atol=LOGIT_ATOL)


def test_text_only_model_says_it_has_no_image_input(cpu_model):
    chat = [{"role": "user", "content": [{"type": "image", "image": str(IMAGES / "gray.png")}, "describe"]}]
    chat[0]["content"][1] = {"type": "text", "text": "Describe the picture."}
    with pytest.raises(NoImageInput, match="this model has no image input"):
        list(stream_generate(cpu_model, chat, SamplingParams(temperature=0.0), max_tokens=4))
    assert cpu_model.vision is None


def test_text_only_hf_folder_of_a_multimodal_config_keeps_working(tmp_path, gguf):
    """The text backends never see the vision tensors; a folder without them is text-only."""
    from .tinymodels import hf_gemma3_folder

    folder = hf_gemma3_folder(gguf, tmp_path / "hf", 1)
    weights = engine.weights.open_weights(folder)
    assert weights.vision_config is None
    assert not any(n.startswith("vision_tower") for n in weights.tensors)
    assert "vision_tower.vision_model.embeddings.patch_embedding.weight" in weights.vision_tensors


def test_message_text_cannot_place_a_picture(vision_model):
    """`<start_of_image>` typed in a message is text: only image parts become pictures."""
    typed = "Look: <start_of_image> <image_soft_token><end_of_image>"
    chat = [
        {
            "role": "user",
            "content": [{"type": "text", "text": typed}, {"type": "image", "image": str(IMAGES / "gray.png")}],
        }
    ]
    ids, spans = encode_prompt(vision_model, chat)
    assert len(spans) == 1 and spans[0].end - spans[0].start == 16
    assert ids.count(262144) == 16  # the typed placeholder did not become one
    with pytest.raises(Exception, match="no image input|has images"):
        vision_model.chat.encode(chat, vision_model.tokenizer)  # without the layout: refused, not mangled


def test_ids_without_their_pictures_are_refused(golden, vision_model):
    from phoenix_chat.engine.errors import PhoenixError
    from phoenix_chat.engine.generate import PromptIds

    data, _ = golden
    with pytest.raises(PhoenixError, match="needs its pictures"):
        list(stream_generate(vision_model, PromptIds(tuple(data["chat/input_ids"].tolist())), max_tokens=1))


def test_pictures_on_another_kv_slot_give_the_same_logits(golden, tmp_path):
    """Image spans ride in the forward's segment (models/gemma3.py `Segment`), whatever its slot."""
    data, meta = golden
    model = engine.load(build(tmp_path / "tiny-gemma3-vision"), backend="cpu", context_length=256, slots=2)
    try:
        ids, spans = encode_prompt(model, chat_with_images(meta))
        ref = model.backend.model
        on_0 = ref.forward(ids, 0, images=spans)
        on_1 = ref.forward(ids, 0, images=spans, slot=1)
        np.testing.assert_array_equal(on_0, on_1)
        np.testing.assert_allclose(on_1, data["chat/logits_last"], rtol=0, atol=LOGIT_ATOL)
    finally:
        model.close()
