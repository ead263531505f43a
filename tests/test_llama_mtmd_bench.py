"""bench/llama_cpp_vulkan.py's llama-mtmd-cli runner and bench/vision_encode.py's side by side
with it, against a stand-in binary that checks its command line and prints llama.cpp's own lines
(their formats from the vendored tools/mtmd: mtmd-cli.cpp's "mtmd batch encoding done in %d ms",
mtmd-helper.cpp's "decoding image batch ..." and "image decoded (batch %d/%d) in %d ms", clip.cpp's
"CLIP using ... backend"). The real binary is built and run on the GPU machine only."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import llama_cpp_vulkan as peer

FAKE = r"""#!{python}
import json, os, sys
args = sys.argv[1:]
def value(flag):
    return args[args.index(flag) + 1]
for flag in ("-m", "--mmproj", "--image"):
    assert os.path.isfile(value(flag)), flag
assert value("-ngl") == "99" and value("-n") == "1", args
state = {state!r}
n = int(open(state).read()) if os.path.exists(state) else 0
open(state, "w").write(str(n + 1))
with open(state + ".log", "a") as log:
    log.write(json.dumps(args) + "\n")
if value("-lv") == "5":  # ggml_vulkan prints its device line at debug level
    print("0.00.062.079 D ggml_vulkan: 0 = NVIDIA H100 80GB HBM3 (NVIDIA) | uma: 0 | fp16: 1 | int dot: 1 | "
          "matrix cores: NV_coopmat2", file=sys.stderr)
print("0.00.073.782 I clip_ctx: CLIP using Vulkan0 backend")
print("encoding mtmd batch, n_chunks = 1 (done = 1, total = 3)")
enc = 500 if n == 0 else 40 + n  # the warm-up is slow
fa = value("-fa")
print(f"mtmd batch encoding done in {{enc + (5 if fa == 'off' else 0)}} ms")
print("decoding image batch 1/1, n_tokens_batch = 256")
print(f"image decoded (batch 1/1) in {{20 + n}} ms")
"""


def fake_binary(tmp_path: Path) -> tuple[Path, Path]:
    exe, state = tmp_path / "llama-mtmd-cli", tmp_path / "runs"
    exe.write_text(FAKE.format(python=sys.executable, state=str(state)))
    exe.chmod(0o755)
    return exe, state


def test_parse_the_lines_llama_cpp_prints():
    log = (
        "encoding mtmd batch, n_chunks = 1 (done = 1, total = 3)\nmtmd batch encoding done in 37 ms\n"
        "decoding image batch 1/2, n_tokens_batch = 200\nimage decoded (batch 1/2) in 11 ms\n"
        "decoding image batch 2/2, n_tokens_batch = 56\nimage decoded (batch 2/2) in 4 ms\n"
    )
    assert peer.parse_mtmd_log(log) == (37.0, 15.0, 256)
    helper = (
        "image slice encoded in 12 ms\ndecoding image batch 1/1, n_tokens_batch = 256\n"
        "image decoded (batch 1/1) in 3 ms"
    )
    assert peer.parse_mtmd_log(helper) == (12.0, 3.0, 256)
    with pytest.raises(RuntimeError, match="0 encode and 0 image decode lines"):
        peer.parse_mtmd_log("llama_model_load: error loading model")


def test_run_mtmd_drops_the_warm_up_and_takes_medians(tmp_path):
    exe, state = fake_binary(tmp_path)
    files = [tmp_path / n for n in ("text.gguf", "mmproj.gguf", "pic.png")]
    for f in files:
        f.write_bytes(b"x")
    text, mmproj, picture = files
    rec = peer.run_mtmd(exe, text, mmproj, picture, repeats=3, flash_attn="on")
    assert rec.encode_runs_ms == [41.0, 42.0, 43.0] and rec.encode_ms == 42.0  # run 0 (500 ms) dropped
    assert rec.image_prefill_runs_ms == [21.0, 22.0, 23.0] and rec.image_prefill_ms == 22.0
    assert rec.image_tokens == 256 and rec.clip_backend == "CLIP using Vulkan0 backend"
    assert rec.device_line.startswith("ggml_vulkan: 0 = NVIDIA H100")
    assert state.read_text() == "4"


def test_run_mtmd_failure_shows_its_output(tmp_path):
    exe = tmp_path / "llama-mtmd-cli"
    exe.write_text(
        f"#!{sys.executable}\nimport sys\nprint('clip_init: failed to load model', file=sys.stderr)\nsys.exit(1)\n"
    )
    exe.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"(?s)llama-mtmd-cli failed \(1\): .*failed to load model"):
        peer.run_mtmd(exe, tmp_path / "a", tmp_path / "b", tmp_path / "c")


def test_the_real_llama_mtmd_cli_on_synthetic_files(tmp_path, model_path):
    """llama.cpp's own llama-mtmd-cli (any build; $PHOENIX_LLAMA_MTMD_CLI, e.g. a CPU build of the
    vendored source) on the tiny synthetic mmproj + text GGUF with a tokenizer: it loads both, the
    chat template and prompt tokenize, and its timing lines parse."""
    import os

    from bench import vision_encode as ve
    from tools.make_synthetic_gguf import write

    binary = os.environ.get("PHOENIX_LLAMA_MTMD_CLI")
    if not binary:
        pytest.skip("no llama-mtmd-cli here (set PHOENIX_LLAMA_MTMD_CLI; the GPU machine builds it)")
    mmproj, picture = ve.llama_mtmd_inputs(ve.TINY, tmp_path)
    text = write(tmp_path / "text.gguf", "tiny", "q4_0", "q8_0", vocab_from=model_path)
    rec = peer.run_mtmd(Path(binary), text, mmproj, picture, repeats=1, flash_attn="on")
    assert rec.image_tokens == ve.TINY.mm_tokens_per_image
    assert rec.encode_ms >= 0 and rec.image_prefill_ms >= 0 and "CLIP using" in rec.clip_backend


def test_vision_encode_puts_llama_cpp_beside_ours(tmp_path):
    """bench_llama_mtmd writes the synthetic mmproj and a picture of the tower's size, runs the
    peer with flash attention on and off, and puts the best of each figure beside ours."""
    from bench import vision_encode as ve

    exe, state = fake_binary(tmp_path)
    text = tmp_path / "text.gguf"
    text.write_bytes(b"x")
    ours = {
        "tower": [{"matrix_type": "F16", "wall_ms": (21.0, 20.0, 22.0)}],
        "prefill": {"prompt_tokens": 267, "with_picture_ms": (10.0, 9.0, 11.0)},
    }
    m = ve.bench_llama_mtmd(exe, text, ve.TINY, tmp_path / "work", 2, ours)
    args = [json.loads(line) for line in Path(str(state) + ".log").read_text().splitlines()]
    assert [(a[a.index("-fa") + 1], a[a.index("-lv") + 1]) for a in args] == [
        ("on", "5"),  # the warm-up at debug level (ggml_vulkan's device line)
        ("on", "4"),
        ("on", "4"),
        ("off", "5"),
        ("off", "4"),
        ("off", "4"),
    ]
    mmproj = Path(m["mmproj"])
    assert all(a[a.index("--mmproj") + 1] == str(mmproj) and a[a.index("-m") + 1] == str(text) for a in args)
    from phoenix_chat.engine.weights.mmproj import MmprojFile

    assert MmprojFile(mmproj).settings(ve.TINY.text_hidden_size, (0, 0, 0)).hidden_size == ve.TINY.hidden_size
    from PIL import Image

    assert Image.open(m["picture"]).size == (ve.TINY.image_size, ve.TINY.image_size)
    # fa on: runs 1, 2 -> encode 41.5 ms; fa off (its warm-up run 3 dropped): runs 4, 5 -> 49.5 ms
    assert m["encode_flash_attn"] == "on" and m["encode_ms"] == 41.5
    assert m["encode_speedup_vs_llama"] == pytest.approx(41.5 / 21.0)
    assert m["image_tokens"] == 256 and m["image_prefill_ms"] == 21.5
    assert m["prefill_rate_ratio_vs_llama"] == pytest.approx((267 / 10.0) / (256 / 21.5))
    ve.print_llama_mtmd(m)
