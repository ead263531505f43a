"""Pictures through the Vulkan backend end to end (lavapipe): a Gemma3ForConditionalGeneration
loaded on Vulkan encodes pictures with its tower on the device (siglip_graph.py) and prefills
an image + text prompt with each picture's soft tokens in place and its tokens attending to
each other both ways (image_prefill.py, attention_prefill.comp's ATTN_SPANS). Checked against
the CPU backend and transformers' goldens on the tiny model of tools/tiny_vision_model.py.

Its text attention has head_dim 32, which the decode attention kernel does not take (multiples
of 64), so the generating tests use the same model with head_dim 64 (`_build_head_dim_64`: the
text attention re-drawn, everything else as in the goldens' model)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phoenix_chat import engine
from phoenix_chat.engine.generate import encode_prompt, stream_generate
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler
from phoenix_chat.engine.vision.spans import ImageSpan
from tests.test_vision import GOLDENS, chat_with_images
from tools import tiny_vision_model

# Max abs logit differences measured on lavapipe (logits up to ~4.6): Vulkan vs the CPU
# reference 1.6e-3 (head_dim 32) and 1.5e-3 (head_dim 64); Vulkan vs transformers 1.2e-3 (last
# position) and 7.0e-4 (each picture's first token). The K/V cache is f16 on Vulkan, f32 on the CPU.
LOGIT_ATOL = 5e-3
SOFT_ATOL = 2e-5  # the device tower's soft tokens (F16 matrices) vs transformers: measured 2.6e-6
GREEDY = SamplingParams(temperature=0.0)


def _build_head_dim_64(folder: Path) -> Path:
    folder = tiny_vision_model.build(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["text_config"] = {**cfg["text_config"], "head_dim": 64, "query_pre_attn_scalar": 64}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    arrays = tiny_vision_model.tensors()
    rng = np.random.default_rng(64)
    h, heads, kv_heads = 64, 2, 1
    shapes = {
        "q_proj": (heads * 64, h),
        "k_proj": (kv_heads * 64, h),
        "v_proj": (kv_heads * 64, h),
        "o_proj": (h, heads * 64),
        "q_norm": (64,),
        "k_norm": (64,),
    }
    for name in arrays:
        short = name.rsplit(".", 2)[-2]
        if "language_model" in name and ".self_attn." in name and short in shapes:
            arrays[name] = rng.normal(0.0, 0.1 if "norm" in short else 0.2, shapes[short]).astype(np.float32)
    tiny_vision_model.write_safetensors(folder / "model.safetensors", arrays)
    return folder


@pytest.fixture(scope="module")
def meta():
    return json.loads((GOLDENS / "transformers_vision.json").read_text())


@pytest.fixture(scope="module")
def golden():
    data = np.load(GOLDENS / "transformers_vision.npz")
    return {k: data[k] for k in data.files}


@pytest.fixture(scope="module")
def models(tmp_path_factory, vk_device):
    folder = tiny_vision_model.build(tmp_path_factory.mktemp("vision") / "tiny-gemma3-vision")
    cpu = engine.load(folder, backend="cpu", context_length=256)
    vk = engine.load(folder, backend="vulkan", context_length=256)
    yield cpu, vk
    vk.close()
    cpu.close()


@pytest.fixture(scope="module")
def models64(tmp_path_factory, vk_device):
    folder = _build_head_dim_64(tmp_path_factory.mktemp("vision64") / "tiny-gemma3-vision-hd64")
    cpu = engine.load(folder, backend="cpu", context_length=256)
    vk = engine.load(folder, backend="vulkan", context_length=256, slots=2)
    yield cpu, vk
    vk.close()
    cpu.close()


def test_the_tower_runs_on_the_device(models, golden):
    _, vk = models
    encoder = vk.vision
    assert encoder.device_tower is not None and encoder.tower is None  # no numpy copy of the tower
    assert vk.backend.stats()["vision_tower"]["matrix_type"] == "F16"
    for name in ("gray", "portrait_rgba"):
        np.testing.assert_allclose(
            encoder.tower_output(golden[f"pixels/{name}"]), golden[f"tower/{name}"], rtol=0, atol=SOFT_ATOL
        )
        _, soft = encoder.soft_tokens(golden[f"pixels/{name}"])
        np.testing.assert_allclose(soft, golden[f"soft/{name}"], rtol=0, atol=SOFT_ATOL)


def test_image_chat_logits_match_cpu_and_transformers(models, golden, meta):
    cpu, vk = models
    ids, spans = encode_prompt(vk, chat_with_images(meta))
    assert ids == golden["chat/input_ids"].tolist()
    want = cpu.backend.forward_images(ids, 0, encode_prompt(cpu, chat_with_images(meta))[1], all_logits=True)
    got = vk.backend.forward_images(ids, 0, spans, all_logits=True)
    np.testing.assert_allclose(got, want, rtol=0, atol=LOGIT_ATOL)
    np.testing.assert_allclose(got[-1], golden["chat/logits_last"], rtol=0, atol=LOGIT_ATOL)
    starts = got[meta["image_starts"], : meta["logit_slice"]]
    np.testing.assert_allclose(starts, golden["chat/logits_image_starts"], rtol=0, atol=LOGIT_ATOL)
    # the last position's logits alone (chunks of the device's prefill size) are the same
    np.testing.assert_allclose(vk.backend.forward_images(ids, 0, spans), got[-1], rtol=0, atol=1e-5)


def test_a_bucketed_picture_chunk_gives_the_exact_chunks_logits(models, meta):
    """Prefill buckets (a GPU's default; off on lavapipe, turned on here): a chunk holding a
    picture runs in its bucket's recording, the pad rows getting no soft tokens, and every
    position's logits and the last one's are those of the exact-length recordings."""
    _, vk = models
    backend = vk.backend
    ids, spans = encode_prompt(vk, chat_with_images(meta))
    want_all = backend.forward_images(ids, 0, spans, all_logits=True)
    want_last = backend.forward_images(ids, 0, spans)
    before = backend.prefill_buckets
    backend.prefill_buckets = True
    try:
        got_all = backend.forward_images(ids, 0, spans, all_logits=True)
        got_last = backend.forward_images(ids, 0, spans)
    finally:
        backend.prefill_buckets = before
    np.testing.assert_allclose(got_all, want_all, rtol=0, atol=1e-4)
    np.testing.assert_allclose(got_last, want_last, rtol=0, atol=1e-4)


def test_a_pictures_first_token_sees_its_last(models, meta):
    """Bidirectional inside a picture: changing a picture's last soft token changes the logits
    at its first; the text before the picture is unaffected (causal outside)."""
    _, vk = models
    ids, spans = encode_prompt(vk, chat_with_images(meta))
    first = spans[0]
    emb = first.embeddings.copy()
    emb[-1] += 1.0
    changed = [ImageSpan(first.start, emb, "changed"), *spans[1:]]
    a = vk.backend.forward_images(ids, 0, spans, all_logits=True)
    b = vk.backend.forward_images(ids, 0, changed, all_logits=True)
    assert np.abs(a[first.start] - b[first.start]).max() > 20 * LOGIT_ATOL  # measured 0.45
    np.testing.assert_array_equal(a[: first.start], b[: first.start])


def test_greedy_continuation_equals_the_cpu_backend(models64, meta):
    cpu, vk = models64
    chat = chat_with_images(meta)
    want = [r.token for r in stream_generate(cpu, chat, GREEDY, max_tokens=8) if r.token is not None]
    got = [r.token for r in stream_generate(vk, chat, GREEDY, max_tokens=8) if r.token is not None]
    assert got == want


def test_scheduler_on_vulkan_answers_a_picture(models64, meta):
    """The scheduler on a Vulkan model (2 slots) answers an image request with the CPU backend's
    greedy answer, while a text request shares its decode steps. The text request goes first, so
    the picture is encoded on this thread (at submit) while the scheduler's thread decodes."""
    cpu, vk = models64
    chat = chat_with_images(meta)
    want = [r.token for r in stream_generate(cpu, chat, GREEDY, max_tokens=8) if r.token is not None]
    text = [{"role": "user", "content": "Hello there"}]
    text_alone = [r.token for r in stream_generate(vk, text, GREEDY, max_tokens=8) if r.token is not None]
    sched = Scheduler(vk)
    try:
        words = sched.submit(Request(text, GREEDY, max_tokens=8))
        picture = sched.submit(Request(chat, GREEDY, max_tokens=8))
        got = [t for d in picture for t in d.token_ids]
        got_text = [t for d in words for t in d.token_ids]
    finally:
        sched.close()
    assert got == want
    assert got_text == text_alone


def test_a_tower_without_room_leaves_pictures_to_the_cpu(tmp_path, vk_device, monkeypatch, golden):
    """Where the device has no room left for the tower (it is not in the memory plan), the model
    still loads: pictures are encoded by the numpy reference, and the backend says why."""
    from phoenix_chat.engine.backends.vulkan import siglip_graph
    from phoenix_chat.engine.errors import OutOfMemoryError

    def no_room(*args, **kwargs):
        raise OutOfMemoryError("out of device memory allocating vision_x (test)")

    monkeypatch.setattr(siglip_graph, "SiglipGraph", no_room)
    folder = tiny_vision_model.build(tmp_path / "tiny-gemma3-vision")
    vk = engine.load(folder, backend="vulkan", context_length=128)
    try:
        assert vk.vision.device_tower is None and vk.vision.tower is not None
        info = vk.backend.stats()["vision_tower"]
        assert info["on_device"] is False and "does not fit beside the text model" in info["why"]
        _, soft = vk.vision.soft_tokens(golden["pixels/gray"])
        np.testing.assert_allclose(soft, golden["soft/gray"], rtol=0, atol=SOFT_ATOL)
    finally:
        vk.close()


def test_prefix_reuse_past_a_picture(models64, meta):
    """A PromptCache on Vulkan: the same pictures again reuse all but the last id; another picture
    in the second span resumes at its start, and the answer is the one from scratch."""
    from phoenix_chat.engine.prompt_cache import PromptCache
    from tests.test_vision import IMAGES

    _, vk = models64
    chat = chat_with_images(meta)
    cache = PromptCache(vk.backend)
    list(stream_generate(vk, chat, GREEDY, max_tokens=2, cache=cache))
    ids, spans = encode_prompt(vk, chat)
    assert cache.plan(ids, spans).reused == len(ids) - 1
    swapped = [dict(chat[0], content=list(chat[0]["content"]))]
    swapped[0]["content"][2] = {"type": "image", "image": str(IMAGES / "gray.png")}
    ids2, spans2 = encode_prompt(vk, swapped)
    assert cache.plan(ids2, spans2).reused == spans2[1].start
    reused = [r.token for r in stream_generate(vk, swapped, GREEDY, max_tokens=4, cache=cache)]
    fresh = [r.token for r in stream_generate(vk, swapped, GREEDY, max_tokens=4)]
    assert reused == fresh


def _pan_and_scan_chat(meta: dict) -> list[dict]:
    """The goldens' one-picture chat (wide.png) with pan-and-scan on: the picture and 3 crops."""
    from tests.test_vision import IMAGES

    chat = meta["pan_and_scan_chat"]
    part = {"type": "image", "image": str(IMAGES / chat["image"]), "pan_and_scan": True}
    return [{"role": "user", "content": [part, chat["chat"][0]["content"][1]]}]


def test_pan_and_scan_logits_match_transformers(models, golden, meta):
    """Pan-and-scan on Vulkan: four pictures (the original and 3 crops), each a span of its own
    encoded by the device tower; the logits are transformers' (tests/test_vision_pan_and_scan.py
    checks the CPU reference the same way)."""
    _, vk = models
    ids, spans = encode_prompt(vk, _pan_and_scan_chat(meta))
    assert ids == golden["pas/input_ids"].tolist() and len(spans) == 4
    got = vk.backend.forward_images(ids, 0, spans, all_logits=True)
    np.testing.assert_allclose(got[-1], golden["pas/logits_last"], rtol=0, atol=LOGIT_ATOL)
    starts = got[meta["pan_and_scan_chat"]["image_starts"], : meta["logit_slice"]]
    np.testing.assert_allclose(starts, golden["pas/logits_image_starts"], rtol=0, atol=LOGIT_ATOL)


def test_scheduler_on_vulkan_answers_with_pan_and_scan(models64):
    """Through the Scheduler on Vulkan (2 slots): the CPU backend's greedy answer with crops."""
    cpu, vk = models64
    chat = _pan_and_scan_chat(json.loads((GOLDENS / "transformers_vision.json").read_text()))
    want = [r.token for r in stream_generate(cpu, chat, GREEDY, max_tokens=8) if r.token is not None]
    sched = Scheduler(vk)
    try:
        final = list(sched.submit(Request(chat, GREEDY, max_tokens=8)))
    finally:
        sched.close()
    assert [t for d in final for t in d.token_ids] == want
    assert final[-1].usage is not None and final[-1].usage.prompt_tokens == len(encode_prompt(cpu, chat)[0])
