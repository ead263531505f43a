"""Pictures through the local server with the real `openai` client: OpenAI `image_url` parts
with base64 `data:` URLs reach the model (a served tiny random-weight
Gemma3ForConditionalGeneration, tools/tiny_vision_model.py, on the CPU backend) and give the
engine's own greedy answer; remote URLs, bad base64, files that are no picture and
decompression bombs are refused with a 400 naming why; the embedded 270M (text-only) answers
400 "this model has no image input"."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import openai
import pytest

from phoenix_chat.app.server.config import ServerConfig
from phoenix_chat.app.server.running import start_server
from phoenix_chat.engine.generate import encode_prompt, generate
from phoenix_chat.engine.loader import load
from phoenix_chat.engine.scheduler import Scheduler
from tools.tiny_vision_model import build

from ..test_vision_inputs import png_header
from .conftest import GREEDY, error_of, raw, still_serves

IMAGES = Path(__file__).parent.parent / "goldens" / "vision_images"
ANSWER = 6


def data_url(data: bytes, media: str = "image/png") -> str:
    return f"data:{media};base64,{base64.b64encode(data).decode()}"


def picture_message(url: str, text: str = "What is in this picture?") -> list[dict]:
    return [
        {
            "role": "user",
            "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
        }
    ]


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    m = load(build(tmp_path_factory.mktemp("vision") / "tiny-gemma3-vision"), backend="cpu", context_length=256)
    yield m
    m.close()


@pytest.fixture(scope="module")
def vision_server(vision_model):
    scheduler = Scheduler(vision_model)
    try:
        with start_server(scheduler, ServerConfig(port=0)) as running:
            yield running
    finally:
        scheduler.close()


@pytest.fixture(scope="module")
def vision_client(vision_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=vision_server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def vision_id(vision_client) -> str:
    return vision_client.models.list().data[0].id


def test_a_data_url_picture_gives_the_engines_greedy_answer(vision_client, vision_id, vision_model):
    picture = (IMAGES / "portrait_rgba.png").read_bytes()
    r = vision_client.chat.completions.create(
        model=vision_id, messages=picture_message(data_url(picture)), max_tokens=ANSWER, temperature=0
    )
    engine_chat = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is in this picture?"}, {"type": "image", "image": picture}],
        }
    ]
    assert r.choices[0].message.content == generate(vision_model, engine_chat, GREEDY, max_tokens=ANSWER)
    # 16 soft tokens and the image markers are in the prompt
    assert r.usage is not None and r.usage.prompt_tokens > 16 + 2


def test_streamed_answer_with_two_pictures_equals_the_whole_one(vision_client, vision_id):
    content = [
        {"type": "image_url", "image_url": {"url": data_url((IMAGES / "exif_rotated.jpg").read_bytes(), "image/jpeg")}},
        {"type": "text", "text": "And this one?"},
        {"type": "image_url", "image_url": {"url": data_url((IMAGES / "small.webp").read_bytes(), "image/webp")}},
    ]
    messages = [{"role": "user", "content": content}]
    whole = vision_client.chat.completions.create(model=vision_id, messages=messages, max_tokens=ANSWER, temperature=0)
    chunks = vision_client.chat.completions.create(
        model=vision_id, messages=messages, max_tokens=ANSWER, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content


def refusal(client: openai.OpenAI, model_id: str, url: str) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_id, messages=picture_message(url), max_tokens=2)
    assert info.value.status_code == 400
    return info.value.body  # type: ignore[return-value]


def test_remote_urls_are_refused_not_fetched(vision_client, vision_id):
    for url in ("https://example.com/cat.png", "http://127.0.0.1:1/cat.png"):
        err = refusal(vision_client, vision_id, url)
        assert "remote image URLs are not fetched" in err["message"]
        assert err["param"] == "messages[0].content[1].image_url.url" and err["code"] == "invalid_image_url"


@pytest.mark.parametrize(
    ("url", "why", "code"),
    [
        ("data:image/png;base64,iVBORw0KGgo$$$", "bad base64", "invalid_image"),
        ("data:image/png,rawbytes", "must be a base64 data: URL", "invalid_image_url"),
        (data_url(b"this is not a picture at all"), "not an image Phoenix Chat reads", "invalid_image"),
        (data_url(png_header(100_000, 100_000)), "refused as a decompression bomb", "invalid_image"),
        (data_url((IMAGES / "gray.png").read_bytes()[:60]), "damaged or truncated|unreadable", "invalid_image"),
    ],
    ids=["bad-base64", "not-base64", "not-an-image", "bomb", "truncated"],
)
def test_bad_pictures_are_a_400_with_the_reason(vision_server, vision_client, vision_id, url, why, code):
    err = refusal(vision_client, vision_id, url)
    assert err["code"] == code
    assert re.search(why, err["message"]), err["message"]
    assert "\n" not in err["message"]
    still_serves(vision_client, vision_id)


def test_raw_error_object_shape(vision_server, vision_id):
    body = {"model": vision_id, "messages": picture_message("https://example.com/a.png"), "max_tokens": 1}
    status, _, data = raw(vision_server, "POST", "/v1/chat/completions", body)
    assert status == 400 and error_of(data)["type"] == "invalid_request_error"


def test_text_only_model_says_it_has_no_image_input(client, model):
    model_id = client.models.list().data[0].id
    err = refusal(client, model_id, data_url((IMAGES / "gray.png").read_bytes()))
    assert "this model has no image input" in err["message"]
    assert err["code"] == "image_input_unsupported" and err["param"] == "messages"
    still_serves(client, model_id)


def test_image_url_parts_become_the_engines_image_parts():
    from phoenix_chat.app.server.parsing import parse_chat

    picture = (IMAGES / "gray.png").read_bytes()
    g = parse_chat({"messages": picture_message(data_url(picture), "Hi")})
    assert g.prompt == [
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image", "image": picture}]}
    ]
    text_only = parse_chat({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]})
    assert text_only.prompt == [{"role": "user", "content": "Hi"}]


def test_pan_and_scan_extension_field_shows_the_model_the_crops(vision_client, vision_id, vision_model):
    """`"pan_and_scan": true` at the top level (our extension): the engine gets every picture with
    its crops (wide.png: 3, the prompt grows by 3 pictures and the processor's words) and the answer
    is the engine's own with pan-and-scan; left out, the prompt is the picture alone."""
    picture = (IMAGES / "wide.png").read_bytes()
    messages = picture_message(data_url(picture), "Describe this wide picture.")
    on = vision_client.chat.completions.create(
        model=vision_id, messages=messages, max_tokens=ANSWER, temperature=0, extra_body={"pan_and_scan": True}
    )
    off = vision_client.chat.completions.create(model=vision_id, messages=messages, max_tokens=ANSWER, temperature=0)
    part = {"type": "image", "image": picture, "pan_and_scan": True}
    engine_chat = [{"role": "user", "content": [{"type": "text", "text": "Describe this wide picture."}, part]}]
    assert on.choices[0].message.content == generate(vision_model, engine_chat, GREEDY, max_tokens=ANSWER)
    ids, spans = encode_prompt(vision_model, engine_chat)
    assert len(spans) == 4 and on.usage is not None and on.usage.prompt_tokens == len(ids)
    part["pan_and_scan"] = False
    assert off.usage is not None and off.usage.prompt_tokens == len(encode_prompt(vision_model, engine_chat)[0])
    assert off.usage.prompt_tokens < on.usage.prompt_tokens - 3 * 16


@pytest.mark.parametrize("value", ["yes", 1, None], ids=["string", "number", "null-is-off"])
def test_pan_and_scan_must_be_a_boolean(vision_server, vision_id, value):
    body = {
        "model": vision_id,
        "messages": picture_message(data_url((IMAGES / "gray.png").read_bytes())),
        "max_tokens": 1,
        "pan_and_scan": value,
    }
    status, _, data = raw(vision_server, "POST", "/v1/chat/completions", body)
    if value is None:  # JSON null: the field left out
        assert status == 200, data
        return
    err = error_of(data)
    assert status == 400 and err["param"] == "pan_and_scan" and err["type"] == "invalid_request_error"
    assert err["message"] == "`pan_and_scan` must be true or false"


def test_pan_and_scan_marks_every_image_part():
    from phoenix_chat.app.server.parsing import parse_chat

    picture = (IMAGES / "gray.png").read_bytes()
    messages = picture_message(data_url(picture), "Hi") + [
        {"role": "assistant", "content": "A gradient."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(picture)}}]},
    ]
    g = parse_chat({"messages": messages, "pan_and_scan": True})
    pictures = [p for m in g.prompt for p in m["content"] if isinstance(p, dict) and p["type"] == "image"]
    assert len(pictures) == 2 and all(p["pan_and_scan"] is True for p in pictures)
    assert g.prompt[1] == {"role": "assistant", "content": "A gradient."}
