"""Pictures through the Scheduler (engine/scheduler.py) on the CPU reference, with the tiny
random-weight Gemma3ForConditionalGeneration of tools/tiny_vision_model.py: the greedy answer
equals stream_generate's, a picture request and a text request served at once each get their
solo answer, the encoder runs once per picture, prefix reuse stops before a different picture,
and what cannot take pictures says so in one line."""

from __future__ import annotations

import pytest

from phoenix_chat import engine
from phoenix_chat.engine.backends.base import NoImageBackend
from phoenix_chat.engine.generate import PromptIds, encode_prompt, stream_generate
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler
from phoenix_chat.engine.vision.prompt import NoImageInput
from tools.tiny_vision_model import build

from .test_vision import IMAGES

GREEDY = SamplingParams(temperature=0.0)
ANSWER = 6


def picture_chat(first: str = "exif_rotated.jpg", second: str = "portrait_rgba.png") -> list[dict]:
    """The goldens' two-picture chat (tests/goldens/transformers_vision.json)."""
    return [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": str(IMAGES / first)},
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image", "image": str(IMAGES / second)},
                {"type": "text", "text": "And how does this one differ?"},
            ],
        }
    ]


TEXT_CHAT = [{"role": "user", "content": "Say something about the sea."}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build(tmp_path_factory.mktemp("vision") / "tiny-gemma3-vision")


@pytest.fixture(scope="module", params=[2, 1], ids=["2-slots", "1-slot"])
def model(request, folder):
    m = engine.load(folder, backend="cpu", context_length=256, slots=request.param)
    yield m
    m.close()


@pytest.fixture
def scheduler(model):
    s = Scheduler(model)
    yield s
    s.close()


def solo(model, chat) -> list[int]:
    """stream_generate's greedy answer from an empty cache (the `run --image` path)."""
    return [r.token for r in stream_generate(model, chat, GREEDY, max_tokens=ANSWER) if r.token is not None]


def answer(stream) -> tuple[list[int], object]:
    deltas = list(stream)
    assert deltas[-1].finish_reason in ("stop", "length"), deltas[-1].error
    return [t for d in deltas for t in d.token_ids], deltas[-1].usage


def test_scheduler_answer_with_pictures_equals_stream_generate(model, scheduler):
    want = solo(model, picture_chat())
    got, usage = answer(scheduler.submit(Request(picture_chat(), GREEDY, ANSWER)))
    assert got == want and len(got) == ANSWER
    assert usage.prompt_tokens == len(encode_prompt(model, picture_chat())[0])


def test_picture_and_text_requests_at_once_each_get_their_solo_answer(model, scheduler):
    want_picture, want_text = solo(model, picture_chat()), solo(model, TEXT_CHAT)
    a = scheduler.submit(Request(picture_chat(), GREEDY, ANSWER))
    b = scheduler.submit(Request(TEXT_CHAT, GREEDY, ANSWER))
    assert answer(a)[0] == want_picture
    assert answer(b)[0] == want_text
    if len(scheduler.slots) > 1:
        assert scheduler.max_batch == 2  # they shared decode steps


def test_same_picture_again_does_not_run_the_encoder(model, scheduler):
    """Soft tokens are cached per image hash in ImageEncoder (engine/vision/encoder.py): a
    regenerate re-reads the files but does not run the tower, and reuses the whole prompt."""
    answer(scheduler.submit(Request(picture_chat(), GREEDY, ANSWER)))
    runs = model.vision.tower_runs
    ids, _ = encode_prompt(model, picture_chat())
    again, usage = answer(scheduler.submit(Request(picture_chat(), GREEDY, ANSWER)))
    assert model.vision.tower_runs == runs
    assert usage.prompt_reused == len(ids) - 1  # the same pictures at the same places
    assert again == solo(model, picture_chat())


def test_prefix_reuse_stops_before_a_different_picture(model, scheduler):
    # one answer token: the slot holds the prompt alone, so the next prompt, keeping half of
    # it, continues in that slot (Scheduler._pick_slot) rather than in an empty one
    answer(scheduler.submit(Request(picture_chat(), GREEDY, 1)))
    swapped = picture_chat(second="gray.png")
    ids, spans = encode_prompt(model, picture_chat())
    ids2, spans2 = encode_prompt(model, swapped)
    assert ids2 == ids  # the same token ids, another picture in the second span
    got, usage = answer(scheduler.submit(Request(swapped, GREEDY, ANSWER)))
    assert usage.prompt_reused == spans2[1].start
    text_after, usage = answer(scheduler.submit(Request(TEXT_CHAT, GREEDY, ANSWER)))
    assert usage.prompt_reused <= spans[0].start  # placeholders held as picture keys never match text
    assert got == solo(model, swapped)
    assert text_after == solo(model, TEXT_CHAT)


def test_prompt_ids_carrying_their_pictures(model, scheduler):
    """What the local server submits: the chat encoded off its event loop, spans riding along."""
    ids, spans = encode_prompt(model, picture_chat())
    got, _ = answer(scheduler.submit(Request(PromptIds(tuple(ids), tuple(spans)), GREEDY, ANSWER, raw=True)))
    assert got == solo(model, picture_chat())


def test_backend_without_the_image_path_refuses_in_one_line(model, scheduler, monkeypatch):
    monkeypatch.setattr(type(model.backend), "takes_images", False)
    monkeypatch.setattr(type(model.backend), "name", "vulkan")
    runs = model.vision.tower_runs
    with pytest.raises(NoImageBackend, match=r"^the vulkan backend does not take images yet: use --backend cpu$"):
        scheduler.submit(Request(picture_chat("gray.png", "small.webp"), GREEDY, ANSWER))
    assert model.vision.tower_runs == runs  # refused before any encoding


def test_text_only_model_refuses_pictures_at_submit(cpu_model):
    scheduler = Scheduler(cpu_model)
    try:
        with pytest.raises(NoImageInput, match="this model has no image input"):
            scheduler.submit(Request(picture_chat(), GREEDY, ANSWER))
    finally:
        scheduler.close()
