"""llama.cpp's split form of a Gemma 3 vision model: a text GGUF + an `mmproj` GGUF, made by
llama.cpp's own converter (`convert_hf_to_gguf.py`, and with `--mmproj` the vision tower and
projector) from the tiny random-weight `Gemma3ForConditionalGeneration` of tiny_vision_model.py.

Why: the split files people download (ggml-org's `gemma-3-*-it-GGUF`: `gemma-3-4b-it-Q4_K_M.gguf` +
`mmproj-model-f16.gguf`) are written by this converter; testing our reader on files we wrote
ourselves could not tell whether we read its tensor layouts and norm conventions as llama.cpp
(tools/mtmd/clip.cpp) does.

Where the converter comes from: the llama-cpp-python sdist of the version the Makefile's
`peer-server` builds (`pip download`, into build/llama-cpp-source/), whose vendor/llama.cpp holds
`convert_hf_to_gguf.py`, its `conversion/` package and its own gguf-py. It needs torch,
transformers and sentencepiece, so it runs in a tools-only venv, build/llama-cpp-convert
(`make convert-tools`: torch==2.13.0 CPU, transformers==4.57.6 as llama.cpp's requirements pin it);
torch is never a dependency of the project.

What is converted (`stage`): the tiny model with six text layers (tiny_vision_model `text_layers=6`:
a GGUF cannot say Gemma 3's sliding-window pattern, llama.cpp reads every gemma3 GGUF as one
global layer in six, so the 2-layer goldens' model would become a different model), written as
the real checkpoints on the Hub are laid out (`language_model.model.*`, `vision_tower.*`,
`multi_modal_projector.*`: the converter's Gemma 3 mmproj class looks for those prefixes), with a
SentencePiece `tokenizer.model` as real Gemma 3 folders have (built here from the embedded 270M's
vocabulary, which is Gemma 3's, so the text GGUF gets the SentencePiece vocabulary real files have,
not a BPE fallback) and `added_tokens_decoder` in tokenizer_config.json as transformers writes it.

Two sides, as in quantize_with_llama_cpp.py:
- `convert(out_dir)` (the project's python): stage, then run the converter twice in the tools venv;
  returns (text GGUF, mmproj GGUF). Raises `ConverterUnavailable` when the venv is not built.
- `python tools/convert_with_llama_cpp.py tokenizer-model FOLDER` (the tools venv's python): writes
  FOLDER/tokenizer.model from FOLDER/vocab-for-spm.json (sentencepiece's protobuf lives there).

    .venv/bin/python -m tools.convert_with_llama_cpp OUT_DIR     # ~1 min on 2 cores
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SDIST_VERSION = "0.3.36"  # the Makefile's LLAMA_CPP_PYTHON_VERSION (one llama.cpp for every tool)
SOURCE_DIR = ROOT / "build" / "llama-cpp-source"
CONVERT_VENV = ROOT / "build" / "llama-cpp-convert"
CONVERT_STAMP = CONVERT_VENV / ".installed"
TEXT_LAYERS = 6
OUTTYPE = "f16"  # as ggml-org's mmproj-model-f16.gguf; the BF16 weights of the tiny model fit f16 exactly
TEXT_NAME = "tiny-gemma3-vision-f16.gguf"
MMPROJ_NAME = "mmproj-tiny-gemma3-vision-f16.gguf"
VOCAB_FILE = "vocab-for-spm.json"
TIMEOUT_S = 900.0
# what the converter needs from the sdist (its other 70 MB are the C++ sources)
_WANTED = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")


class ConverterUnavailable(RuntimeError):
    """The tools venv (torch) or the llama.cpp source cannot be had on this machine."""


def converter_python() -> Path | None:
    """The tools venv's python, or None when `make convert-tools` has not run."""
    exe = CONVERT_VENV / "bin" / "python"
    return exe if CONVERT_STAMP.exists() and exe.exists() else None


def llama_cpp_source() -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist (downloaded with pip and unpacked once)."""
    top = SOURCE_DIR / f"llama_cpp_python-{SDIST_VERSION}"
    vendor = top / "vendor" / "llama.cpp"
    if (vendor / "convert_hf_to_gguf.py").exists() and (vendor / ".unpacked").exists():
        return vendor
    SOURCE_DIR.mkdir(parents=True, exist_ok=True)
    sdist = SOURCE_DIR / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if not sdist.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        cmd += [f"llama-cpp-python=={SDIST_VERSION}", "-d", str(SOURCE_DIR)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        if proc.returncode != 0 or not sdist.exists():
            raise ConverterUnavailable(f"pip could not download the llama-cpp-python sdist: {proc.stderr[-500:]}")
    prefix = f"{top.name}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(tuple(prefix + w for w in _WANTED))]
        tar.extractall(SOURCE_DIR, members=members, filter="data")
    (vendor / ".unpacked").touch()
    return vendor


def stage(folder: Path) -> Path:
    """The tiny 6-text-layer model as a Hub-style Gemma 3 folder the converter takes (the
    project's python: it reads the embedded model's vocabulary)."""
    from tools import tiny_vision_model as tiny

    folder = Path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    tiny.build(folder, text_layers=TEXT_LAYERS)
    hub = {_hub_name(name): a for name, a in tiny.tensors(text_layers=TEXT_LAYERS).items()}
    tiny.write_safetensors(folder / "model.safetensors", hub)
    # added_tokens_decoder, as transformers saves it: the converter types these tokens from it
    tok = json.loads((folder / "tokenizer.json").read_text())
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["added_tokens_decoder"] = {
        str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
        for t in tok["added_tokens"]
    }
    cfg_path.write_text(json.dumps(cfg, indent=1))
    _write_vocab(folder / VOCAB_FILE)
    return folder


def _hub_name(name: str) -> str:
    """transformers' current names -> the Hub checkpoints' (google/gemma-3-4b-it)."""
    if name.startswith("model.language_model."):
        return "language_model.model." + name.removeprefix("model.language_model.")
    return name.removeprefix("model.")


def _write_vocab(path: Path) -> None:
    """Gemma 3's SentencePiece pieces, scores and types (the embedded 270M's GGUF vocabulary)."""
    from phoenix_chat.engine.weights import embedded_model_path
    from phoenix_chat.engine.weights.gguf_file import GGUFFile

    w = GGUFFile(embedded_model_path())
    try:
        m = w.metadata
        vocab = {
            "pieces": list(m["tokenizer.ggml.tokens"]),
            "scores": [float(x) for x in m["tokenizer.ggml.scores"]],
            "types": [int(x) for x in m["tokenizer.ggml.token_type"]],
            "unk_id": int(m["tokenizer.ggml.unknown_token_id"]),
            "bos_id": int(m["tokenizer.ggml.bos_token_id"]),
            "eos_id": int(m["tokenizer.ggml.eos_token_id"]),
            "pad_id": int(m["tokenizer.ggml.padding_token_id"]),
        }
    finally:
        w.close()
    path.write_text(json.dumps(vocab))


def write_tokenizer_model(folder: Path) -> None:
    """FOLDER/tokenizer.model from FOLDER/vocab-for-spm.json (the tools venv: sentencepiece's
    protobuf module). Gemma 3's settings: BPE with byte fallback, no dummy prefix, identity
    normalization; the unknown piece typed UNKNOWN (SentencePiece requires it)."""
    from sentencepiece import SentencePieceProcessor
    from sentencepiece import sentencepiece_model_pb2 as spm

    vocab = json.loads((folder / VOCAB_FILE).read_text())
    proto = spm.ModelProto()
    for i, (piece, score, kind) in enumerate(zip(vocab["pieces"], vocab["scores"], vocab["types"])):
        p = proto.pieces.add()
        p.piece, p.score = piece, score
        p.type = spm.ModelProto.SentencePiece.UNKNOWN if i == vocab["unk_id"] else kind
    t = proto.trainer_spec
    t.model_type = spm.TrainerSpec.BPE
    t.vocab_size = len(vocab["pieces"])
    t.byte_fallback = True
    t.unk_id, t.bos_id, t.eos_id, t.pad_id = vocab["unk_id"], vocab["bos_id"], vocab["eos_id"], vocab["pad_id"]
    n = proto.normalizer_spec
    n.name, n.add_dummy_prefix, n.remove_extra_whitespaces, n.escape_whitespaces = "identity", False, False, True
    (folder / "tokenizer.model").write_bytes(proto.SerializeToString())
    sp = SentencePieceProcessor()
    sp.LoadFromFile(str(folder / "tokenizer.model"))  # the converter loads it the same way
    if sp.vocab_size() != len(vocab["pieces"]):
        raise RuntimeError(f"tokenizer.model holds {sp.vocab_size()} pieces, not {len(vocab['pieces'])}")
    (folder / VOCAB_FILE).unlink()


def convert(out_dir: Path | str, work: Path | str | None = None) -> tuple[Path, Path]:
    """(text GGUF, mmproj GGUF) in `out_dir`, written by llama.cpp's converter from the staged
    tiny model (`work`: where to stage it; default out_dir/tiny-gemma3-vision)."""
    exe = converter_python()
    if exe is None:
        raise ConverterUnavailable(f"the converter's venv is not built: run `make convert-tools` (no {CONVERT_STAMP})")
    source = llama_cpp_source()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    folder = stage(Path(work) if work else out / "tiny-gemma3-vision")
    _run([str(exe), __file__, "tokenizer-model", str(folder)])
    text = out / TEXT_NAME
    _run([str(exe), str(source / "convert_hf_to_gguf.py"), str(folder), "--outtype", OUTTYPE, "--outfile", str(text)])
    return text, convert_mmproj(folder, out / MMPROJ_NAME)


def convert_mmproj(folder: Path | str, out: Path | str, outtype: str = OUTTYPE) -> Path:
    """`convert_hf_to_gguf.py --mmproj --outtype OUTTYPE` of a staged folder (f16, bf16, f32, q8_0:
    the mmproj releases come as F16, BF16, F32 and Q8_0)."""
    exe = converter_python()
    if exe is None:
        raise ConverterUnavailable(f"the converter's venv is not built: run `make convert-tools` (no {CONVERT_STAMP})")
    script = str(llama_cpp_source() / "convert_hf_to_gguf.py")
    _run([str(exe), script, str(folder), "--outtype", outtype, "--mmproj", "--outfile", str(out)])
    return Path(out)


def _run(cmd: list[str]) -> None:
    # one torch thread: two OpenMP threads on a shared 2-core machine slow everything down
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("NO_LOCAL_GGUF", None)  # the sdist's own gguf-py, never another gguf package
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[1]).name} failed ({proc.returncode}): {proc.stderr[-3000:]}")


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "tokenizer-model":
        write_tokenizer_model(Path(argv[1]))
        return 0
    if len(argv) != 1:
        print(__doc__)
        return 2
    text, mmproj = convert(Path(argv[0]))
    for path in (text, mmproj):
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
