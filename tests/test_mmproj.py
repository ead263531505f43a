"""llama.cpp's split form of a Gemma 3 vision model (text GGUF + mmproj GGUF), as llama.cpp's own
converter writes it (tools/convert_with_llama_cpp.py) from the tiny random-weight model of
tools/tiny_vision_model.py (six text layers: the one Gemma 3 layer pattern a GGUF can say).

The mmproj made by the converter is committed (tests/goldens/mmproj-tiny-gemma3-vision-f16.gguf,
124 KiB), so its reader, the tower against transformers' goldens and the refusals run anywhere; the
text GGUF (39 MiB: the real 262k vocabulary) is converted at test time in the tools venv
(`make convert-tools`, part of `make test`) and cached under pytest's cache, and the fresh mmproj
must be byte for byte the committed one.

Tolerances: the converter stores matrices in F16 (the model's BF16 values fit exactly) and the
norms/embeddings in F32, so the pair's tower and soft tokens equal the Hugging Face folder's
bit for bit (measured max |diff| 0.0) and the logits differ only by summation order in the text
model's F16-vs-BF16 matrices read as f32 (measured 2.4e-6 on values ~4): asserted at 1e-6 / 2e-5.
Against transformers' goldens the bounds are test_vision.py's. Against llama.cpp itself (libmtmd
of the peer build, tools/llama_cpp_mtmd.py, on the same files and pixels): soft tokens 5e-3 and
logits 1e-2 (ggml rounds activations to f16 in its F16 matmuls; measured 2.1e-3 and 4.2e-3), the
same prompt ids and greedy tokens. BF16 and Q8_0 mmproj files: see their test."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from phoenix_chat import engine
from phoenix_chat.app import cli
from phoenix_chat.engine.errors import ModelFileError, UnsupportedModelError
from phoenix_chat.engine.generate import encode_prompt, stream_generate
from phoenix_chat.engine.loader import check_loadable
from phoenix_chat.engine.requests import Request
from phoenix_chat.engine.sampling import SamplingParams
from phoenix_chat.engine.scheduler import Scheduler
from phoenix_chat.engine.vision.encoder import ImageEncoder
from phoenix_chat.engine.vision.prompt import NoImageInput
from phoenix_chat.engine.weights import open_weights
from phoenix_chat.engine.weights.mmproj import AUTO, MmprojFile

from .test_cli import cli as run_cli
from .test_vision import IMAGES as IMAGES_DIR
from .test_vision import SOFT_ATOL, TOWER_ATOL
from .test_vision_scheduler import picture_chat

GOLDENS = Path(__file__).parent / "goldens"
MMPROJ = GOLDENS / "mmproj-tiny-gemma3-vision-f16.gguf"
SPLIT_TOWER_ATOL = 1e-6  # pair vs HF folder: the same f32 values (measured 0.0)
SPLIT_LOGIT_ATOL = 2e-5  # F16 vs BF16 storage of the same values, summed in another order (measured 2.4e-6)
GREEDY = SamplingParams(temperature=0.0)
ANSWER = 8
IDS = (262144, 255999, 256000)  # placeholder, <start_of_image>, <end_of_image>


@pytest.fixture(scope="module")
def golden():
    data = np.load(GOLDENS / "transformers_vision.npz")
    return {k: data[k] for k in data.files}


@pytest.fixture(scope="session")
def split(request, tmp_path_factory):
    """(text GGUF, mmproj GGUF, the Hugging Face folder they came from) made by llama.cpp's converter."""
    from tools import convert_with_llama_cpp as conv
    from tools import tiny_vision_model

    if conv.converter_python() is None:
        pytest.skip("llama.cpp's converter needs torch: `make convert-tools` builds its venv (`make test` does)")
    recipe = hashlib.sha256(conv.SDIST_VERSION.encode())
    for module in (conv, tiny_vision_model):
        recipe.update(Path(str(module.__file__)).read_bytes())
    cache = getattr(request.config, "cache", None)
    root = Path(cache.mkdir("llama-cpp-split")) if cache is not None else tmp_path_factory.mktemp("split")
    out = root / recipe.hexdigest()[:16]
    text, mmproj, folder = out / conv.TEXT_NAME, out / conv.MMPROJ_NAME, out / "tiny-gemma3-vision"
    if not (text.exists() and mmproj.exists() and (folder / "config.json").exists()):
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            conv.convert(partial)
        except conv.ConverterUnavailable as exc:
            pytest.skip(f"llama.cpp's converter is unavailable: {exc}")
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
    return text, mmproj, folder


def beside(tmp_path: Path, text: Path, *mmprojs: Path) -> Path:
    """A model folder holding the text GGUF and these mmproj files (links); returns the model's path."""
    folder = tmp_path / "models"
    folder.mkdir(parents=True)
    (folder / text.name).symlink_to(text)
    for m in mmprojs:
        (folder / m.name).symlink_to(m)
    return folder / text.name


@pytest.fixture(scope="module")
def pair_model(split, tmp_path_factory):
    """The text GGUF loaded with its mmproj beside it (automatic pairing), CPU backend."""
    text, mmproj, _ = split
    model = engine.load(beside(tmp_path_factory.mktemp("auto"), text, mmproj), backend="cpu", context_length=256)
    yield model
    model.close()


@pytest.fixture(scope="module")
def hf_model(split):
    model = engine.load(split[2], backend="cpu", context_length=256)
    yield model
    model.close()


def rewrite(
    src: Path, dst: Path, meta: dict | None = None, drop: tuple[str, ...] = (), drop_keys: tuple[str, ...] = ()
) -> Path:
    """A copy of a GGUF with some metadata values replaced or left out and some tensors left out (gguf-py)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(src)
    writer = GGUFWriter(dst, arch=str(reader.fields["general.architecture"].contents()))
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        value = (meta or {}).get(key, field.contents())
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in reader.tensors:
        if t.name not in drop:
            writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


# ---- the committed mmproj (no converter needed) ------------------------------------------------


def test_mmproj_settings_come_from_its_clip_metadata():
    mm = MmprojFile(MMPROJ)
    cfg = mm.settings(64, IDS)
    assert (cfg.image_size, cfg.patch_size, cfg.hidden_size, cfg.intermediate_size) == (112, 14, 32, 64)
    assert (cfg.num_layers, cfg.num_heads, cfg.mm_tokens_per_image) == (2, 2, 16)  # scale_factor 2: 8x8 -> 4x4
    assert cfg.image_mean == cfg.image_std == (0.5, 0.5, 0.5)
    assert mm.projection_dim == 64
    assert mm.tensor_types() == {"F16": 13, "F32": 26}  # the 12 layer matrices + projection; the rest F32
    mm.close()


@pytest.mark.parametrize("name", ["exif_rotated", "portrait_rgba", "gray", "two_frames", "small"])
def test_mmproj_tower_and_soft_tokens_match_transformers(golden, name):
    """The converter's tensor layouts and norm conventions read as clip.cpp reads them: our SigLIP
    tower and projector on the mmproj give transformers' outputs for the same weights."""
    mm = MmprojFile(MMPROJ)

    class Source:  # the text half is not needed for the tower
        path = mm.path
        vision_tensor = staticmethod(mm.vision_tensor)

    encoder = ImageEncoder(Source(), mm.settings(64, IDS))  # type: ignore[arg-type]
    pixels = golden[f"pixels/{name}"]
    np.testing.assert_allclose(encoder.tower_output(pixels), golden[f"tower/{name}"], rtol=0, atol=TOWER_ATOL)
    np.testing.assert_allclose(encoder.soft_tokens(pixels)[1], golden[f"soft/{name}"], rtol=0, atol=SOFT_ATOL)


def test_mmproj_for_another_model_is_refused_in_one_line(model_path):
    """The embedded 270M (width 640) with the tiny model's mmproj (projects into 64)."""
    with pytest.raises(ModelFileError, match=r"mmproj for another model: it projects into width 64, .* width 640"):
        check_loadable(model_path, "cpu", None, mmproj=MMPROJ)


def test_unsupported_projector_type_is_refused(tmp_path):
    other = rewrite(MMPROJ, tmp_path / "mmproj-other.gguf", meta={"clip.projector_type": "idefics3"})
    with pytest.raises(
        UnsupportedModelError, match=r"unsupported projector type 'idefics3': .* Gemma 3's \('gemma3'\)"
    ):
        MmprojFile(other)


def test_missing_tensor_is_named(tmp_path):
    broken = rewrite(MMPROJ, tmp_path / "mmproj-broken.gguf", drop=("v.blk.1.attn_q.weight",))
    with pytest.raises(ModelFileError, match=r"missing 1 tensor\(s\), e.g. 'v.blk.1.attn_q.weight'"):
        MmprojFile(broken)


def test_without_a_scale_factor_the_patches_pool_by_four_as_in_clip_cpp(tmp_path):
    """Real Gemma 3 mmproj files carry no scale factor (64 x 64 patches -> 16 x 16 = 256 tokens):
    clip.cpp's n_merge is 4 then; on the tiny model's 8 x 8 patches that leaves 2 x 2."""
    plain = rewrite(MMPROJ, tmp_path / "mmproj-plain.gguf", drop_keys=("clip.vision.projector.scale_factor",))
    assert MmprojFile(plain).settings(64, IDS).mm_tokens_per_image == 4


def test_mangled_or_missing_clip_metadata_is_refused(tmp_path):
    odd = rewrite(MMPROJ, tmp_path / "mmproj-odd.gguf", meta={"clip.vision.projector.scale_factor": 3})
    with pytest.raises(ModelFileError, match=r"mangled clip.\* metadata \(8 x 8 patches do not pool by 3\)"):
        MmprojFile(odd)
    bare = rewrite(MMPROJ, tmp_path / "mmproj-bare.gguf", drop_keys=("clip.vision.projection_dim",))
    with pytest.raises(ModelFileError, match="mmproj metadata lacks 'clip.vision.projection_dim'"):
        MmprojFile(bare)


def test_an_mmproj_given_as_the_model_says_what_it_is():
    with pytest.raises(UnsupportedModelError, match="this is an mmproj file .* --mmproj"):
        open_weights(MMPROJ)


def test_a_text_model_given_as_the_mmproj_is_refused(model_path):
    with pytest.raises(ModelFileError, match=r"not an mmproj file \(a 'gemma3' model"):
        MmprojFile(model_path)


def test_an_mmproj_beside_the_model_for_another_model_is_not_paired_and_says_why(model_path, tmp_path):
    weights = open_weights(beside(tmp_path, Path(model_path), MMPROJ), mmproj=AUTO)
    assert weights.vision_config is None and weights.mmproj is None
    assert weights.mmproj_note.startswith(f"not paired: {MMPROJ.name} beside the model does not fit it")
    assert "projects into width 64" in weights.mmproj_note
    weights.close()


def test_a_folder_model_takes_no_mmproj(tmp_path):
    from tools.tiny_vision_model import build

    folder = build(tmp_path / "hf")
    with pytest.raises(UnsupportedModelError, match="a Hugging Face folder carries its own vision tower"):
        open_weights(folder, mmproj=MMPROJ)


# ---- the converted pair --------------------------------------------------------------------------


def test_the_converter_reproduces_the_committed_mmproj(split):
    assert split[1].read_bytes() == MMPROJ.read_bytes()


def test_pair_tower_and_soft_tokens_equal_the_hf_folder(pair_model, hf_model, golden):
    for name in ("exif_rotated", "portrait_rgba", "gray"):
        pixels = golden[f"pixels/{name}"]
        ours, ref = pair_model.vision.tower_output(pixels), hf_model.vision.tower_output(pixels)
        np.testing.assert_allclose(ours, ref, rtol=0, atol=SPLIT_TOWER_ATOL)
        np.testing.assert_allclose(
            pair_model.vision.soft_tokens(pixels)[1],
            hf_model.vision.soft_tokens(pixels)[1],
            rtol=0,
            atol=SPLIT_TOWER_ATOL,
        )


def test_pair_prompt_and_logits_equal_the_hf_folder(pair_model, hf_model):
    ids, spans = encode_prompt(pair_model, picture_chat())
    ref_ids, ref_spans = encode_prompt(hf_model, picture_chat())
    assert ids == ref_ids and [(s.start, s.end) for s in spans] == [(s.start, s.end) for s in ref_spans]
    ours = pair_model.backend.forward_images(ids, 0, spans, all_logits=True)
    ref = hf_model.backend.forward_images(ref_ids, 0, ref_spans, all_logits=True)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=SPLIT_LOGIT_ATOL)


def test_pair_greedy_answer_equals_the_hf_folder(pair_model, hf_model):
    def greedy(model):
        return [
            r.token for r in stream_generate(model, picture_chat(), GREEDY, max_tokens=ANSWER) if r.token is not None
        ]

    want = greedy(hf_model)
    assert greedy(pair_model) == want and len(want) == ANSWER
    scheduler = Scheduler(pair_model)
    try:
        deltas = list(scheduler.submit(Request(picture_chat(), GREEDY, ANSWER)))
    finally:
        scheduler.close()
    assert deltas[-1].finish_reason == "length", deltas[-1].error
    assert [t for d in deltas for t in d.token_ids] == want


def test_automatic_pairing_is_described(pair_model):
    d = pair_model.describe()
    assert Path(d["mmproj"]).name == MMPROJ.name
    assert d["mmproj_note"] == "paired automatically: the only mmproj*.gguf beside the model"


def test_automatic_pairing_ignores_case(split, tmp_path):
    text, mmproj, _ = split
    model = beside(tmp_path, text)
    (model.parent / "MMProj-Model-F16.GGUF").symlink_to(mmproj)
    weights = open_weights(model, mmproj=AUTO)
    try:
        assert weights.mmproj is not None and weights.mmproj.path.name == "MMProj-Model-F16.GGUF"
        assert weights.vision_config is not None
    finally:
        weights.close()


def test_several_mmproj_files_beside_the_model_are_not_guessed(split, tmp_path):
    text, mmproj, _ = split
    second = tmp_path / "mmproj-other-f16.gguf"
    shutil.copy(mmproj, second)
    weights = open_weights(beside(tmp_path, text, mmproj, second), mmproj=AUTO)
    assert weights.vision_config is None
    assert weights.mmproj_note == (
        f"not paired: 2 mmproj*.gguf files beside the model (mmproj-other-f16.gguf, {MMPROJ.name}); "
        "choose one with --mmproj"
    )
    weights.close()


def test_the_text_gguf_alone_has_no_image_input(split, tmp_path):
    model = engine.load(beside(tmp_path, split[0]), backend="cpu", context_length=128)
    try:
        assert model.vision is None and model.describe()["mmproj"] == ""
        with pytest.raises(NoImageInput, match="this model has no image input"):
            list(stream_generate(model, picture_chat(), GREEDY, max_tokens=2))
    finally:
        model.close()


def test_load_with_mmproj_takes_pictures(split, tmp_path, pair_model):
    """`load(mmproj=...)` with the two files in different folders: the model takes pictures and
    answers as the automatically paired one does."""
    text, mmproj, _ = split
    model = engine.load(beside(tmp_path, text), backend="cpu", context_length=256, mmproj=mmproj)
    try:
        assert model.vision is not None and model.describe()["mmproj"] == str(mmproj)
        assert model.describe()["mmproj_note"] == "given with --mmproj"
        got = [r.token for r in stream_generate(model, picture_chat(), GREEDY, max_tokens=4) if r.token is not None]
        want = [
            r.token for r in stream_generate(pair_model, picture_chat(), GREEDY, max_tokens=4) if r.token is not None
        ]
        assert got == want
    finally:
        model.close()


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_cli_mmproj_flag_reaches_the_engine(split, tmp_path, command):
    """run, chat and serve load through cli._load: --mmproj gives a model that takes pictures."""
    text, mmproj, _ = split
    lone = beside(tmp_path, text)
    argv = [command, "hello"] if command == "run" else [command]
    args = cli.build_parser().parse_args([*argv, "--model", str(lone), "--mmproj", str(mmproj), "--backend", "cpu"])
    model = cli._load(args)
    try:
        assert model.vision is not None and model.describe()["mmproj"] == str(mmproj)
    finally:
        model.close()
    args = cli.build_parser().parse_args([*argv, "--model", str(lone), "--backend", "cpu", "--ctx", "64"])
    model = cli._load(args)
    try:
        assert model.vision is None
    finally:
        model.close()


def test_cli_run_with_image_and_mmproj_answers_as_the_engine(split, tmp_path, pair_model):
    text, mmproj, _ = split
    lone = beside(tmp_path, text)
    chat = picture_chat()
    images = [part["image"] for part in chat[0]["content"] if part["type"] == "image"]
    prompt = "What is in this picture?"
    argv = ["run", prompt, "--model", str(lone), "--backend", "cpu", "--image", images[0], "--temperature", "0"]
    proc = run_cli(*argv, "--mmproj", str(mmproj), "--max-tokens", "6")
    assert proc.returncode == 0, proc.stderr
    one_picture = [
        {"role": "user", "content": [{"type": "image", "image": images[0]}, {"type": "text", "text": prompt}]}
    ]
    want = "".join(r.text for r in stream_generate(pair_model, one_picture, GREEDY, max_tokens=6))
    assert proc.stdout == want + "\n"
    proc = run_cli(*argv, "--max-tokens", "2")  # the same without --mmproj: the text GGUF alone
    assert proc.returncode == 2 and "this model has no image input" in proc.stderr


def test_cli_info_names_the_paired_file(split, tmp_path):
    text, mmproj, _ = split
    lone = beside(tmp_path, text)
    proc = run_cli("info", "--model", str(lone), "--mmproj", str(mmproj), "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["mmproj"] == str(mmproj) and info["mmproj_note"] == "given with --mmproj"
    assert info["image_input"].startswith("yes: SigLIP 112 px, patch 14, 2 layers, width 32, 16 tokens per image")
    model = beside(tmp_path / "auto", text, mmproj)
    proc = run_cli("info", "--model", str(model))
    assert proc.returncode == 0, proc.stderr
    paired = model.parent / mmproj.name
    assert f"vision file:    {paired} (paired automatically: the only mmproj*.gguf beside the model)" in proc.stdout


@pytest.mark.parametrize("command", ["run", "chat"])
def test_mmproj_with_remote_is_refused(command):
    """A remote server brings its own model: --mmproj is for this computer's engine, never ignored."""
    argv = [command, "hi"] if command == "run" else [command]
    proc = run_cli(*argv, "--remote", "http://127.0.0.1:9", "--mmproj", str(MMPROJ), timeout=120)
    assert proc.returncode == 2
    assert "--mmproj: for this computer's engine, not with --remote" in proc.stderr


def test_serve_with_mmproj_answers_a_picture_as_the_engine(split, tmp_path, pair_model):
    """`serve --mmproj`: an OpenAI image_url (data: URL) reaches the paired tower; the answer is the
    engine's own greedy one."""
    import base64
    import signal

    from .server.test_serve_cli import _free_port, _get, _serve, _wait_listening

    text, mmproj, _ = split
    image = Path(picture_chat()[0]["content"][0]["image"])
    prompt = "What is in this picture?"
    url = f"data:image/jpeg;base64,{base64.b64encode(image.read_bytes()).decode()}"
    body = {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": prompt}],
            }
        ],
        "temperature": 0,
        "max_tokens": 6,
    }
    chat = [{"role": "user", "content": [{"type": "image", "image": str(image)}, {"type": "text", "text": prompt}]}]
    want = "".join(r.text for r in stream_generate(pair_model, chat, GREEDY, max_tokens=6))
    assert want.strip()
    port = _free_port()
    lone = beside(tmp_path, text)
    proc = _serve(
        "--model", str(lone), "--mmproj", str(mmproj), "--backend", "cpu", "--ctx", "256", "--port", str(port)
    )
    try:
        _wait_listening(proc, port)
        status, _, raw = _get(port, "/v1/chat/completions", method="POST", body=body)
        assert status == 200, raw
        assert json.loads(raw)["choices"][0]["message"]["content"] == want
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_llama_cpp_reads_the_pair_as_we_do(split, tmp_path, pair_model):
    """llama.cpp's own multimodal path (libmtmd from the peer build: clip.cpp + llama.cpp, through
    tools/llama_cpp_mtmd.py) on the same two files and pixels: the same prompt ids around the
    pictures, the same soft tokens and last logits within f16 activation rounding (ggml's CPU
    matmuls round activations to f16 against F16 weights; measured 2.1e-3 on values ~3.6 and
    4.2e-3 on ~4), and the same 8 greedy tokens."""
    from PIL import Image

    from phoenix_chat.engine.vision.images import load_pixels
    from tools import llama_cpp_mtmd
    from tools import llama_cpp_server as peer

    if peer.python() is None:
        pytest.skip("llama.cpp is not built: `make peer-server` (part of `make test`)")
    text, mmproj, _ = split
    chat = picture_chat()
    pictures, paths = [], []
    for i, part in enumerate(p for p in chat[0]["content"] if p["type"] == "image"):
        # at the tower's size: clip.cpp's bilinear resize is not Pillow's, the pixels must be the same
        rgb = Image.open(part["image"]).convert("RGB").resize((112, 112), Image.Resampling.BILINEAR)
        paths.append(tmp_path / f"picture{i}.png")
        rgb.save(paths[-1])
        pictures.append(np.asarray(rgb))
        part["image"] = str(paths[-1])
    # the processor's layout written out: "\n\n" around each picture, which mtmd does not add itself
    prompt = (
        "<start_of_turn>user\n\n\n<__media__>\n\nWhat is in this picture?\n\n<__media__>\n\n"
        "And how does this one differ?<end_of_turn>\n<start_of_turn>model\n"
    )
    ref = llama_cpp_mtmd.run(text, mmproj, pictures, prompt, answer_tokens=ANSWER)

    ids, spans = encode_prompt(pair_model, chat)
    theirs = [t for kind, v in ref["chunks"] for t in (v if kind == "text" else [IDS[0]] * v)]
    assert theirs == ids
    assert [v for kind, v in ref["chunks"] if kind == "image"] == [s.end - s.start for s in spans] == [16, 16]
    for path, soft in zip(paths, ref["soft"]):
        ours = pair_model.vision.soft_tokens(load_pixels(path, pair_model.vision.cfg))[1]
        np.testing.assert_allclose(ours, soft, rtol=0, atol=5e-3)
    np.testing.assert_allclose(pair_model.backend.forward_images(ids, 0, spans), ref["logits"], rtol=0, atol=1e-2)
    ours = [r.token for r in stream_generate(pair_model, chat, GREEDY, max_tokens=ANSWER) if r.token is not None]
    assert ours == ref["greedy"]


@pytest.mark.parametrize(("outtype", "hf_atol", "llama_atol"), [("bf16", 1e-6, 2e-2), ("q8_0", 0.1, 0.1)])
def test_bf16_and_q8_0_mmproj_files(split, tmp_path, outtype, hf_atol, llama_atol):
    """mmproj releases also come in BF16 and Q8_0 (the converter's --outtype). BF16 holds the tiny
    model's values exactly: the HF folder's soft tokens bit for bit (measured 0.0). Q8_0 rounds the
    layer matrices: within 0.1 of the HF folder (measured 0.046 on values ~3.6). Against llama.cpp on
    the same file (it also rounds activations: to BF16, or to Q8_0 blocks): measured 8.3e-3 and 0.038."""
    from PIL import Image

    from phoenix_chat.engine.vision.images import load_pixels
    from tools import convert_with_llama_cpp as conv
    from tools import llama_cpp_mtmd
    from tools import llama_cpp_server as peer

    text, _, folder = split
    mmproj = text.parent / f"mmproj-tiny-gemma3-vision-{outtype}.gguf"
    if not mmproj.exists():
        conv.convert_mmproj(folder, tmp_path / mmproj.name, outtype)
        shutil.move(tmp_path / mmproj.name, mmproj)
    weights = open_weights(text, mmproj=mmproj)
    hf = open_weights(folder)
    try:
        assert weights.mmproj is not None
        kind = {"bf16": "BF16", "q8_0": "Q8_0"}[outtype]
        assert weights.mmproj.tensor_types() == {kind: 12, "F16": 1, "F32": 26}  # the projection stays F16
        rgb = Image.open(IMAGES_DIR / "exif_rotated.jpg").convert("RGB").resize((112, 112), Image.Resampling.BILINEAR)
        rgb.save(tmp_path / "picture.png")
        pixels = load_pixels(tmp_path / "picture.png", hf.vision_config)
        assert weights.vision_config is not None and hf.vision_config is not None
        ours = ImageEncoder(weights, weights.vision_config).soft_tokens(pixels)[1]
        np.testing.assert_allclose(
            ours, ImageEncoder(hf, hf.vision_config).soft_tokens(pixels)[1], atol=hf_atol, rtol=0
        )
        if peer.python() is None:
            pytest.skip("llama.cpp is not built: `make peer-server` (part of `make test`)")
        ref = llama_cpp_mtmd.run(text, mmproj, [np.asarray(rgb)], "<__media__>", answer_tokens=1)
        np.testing.assert_allclose(ours, ref["soft"][0], atol=llama_atol, rtol=0)
    finally:
        weights.close()
        hf.close()
