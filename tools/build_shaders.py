#!/usr/bin/env python3
"""Compile every pipeline variant in engine/backends/vulkan/pipelines.py to shaders/spv/.

Each variant's hash covers its shader source, every file it includes (recursively), its -D
defines (the generated push-constant block among them) and the compiler flags. The hashes go
to shaders/spv/manifest.json; tests/vulkan/test_shaders_fresh.py fails when a committed .spv
no longer matches its sources. Only stale variants are rebuilt unless --force.

Generated includes (`GENERATED`: shaders/include/step.glsl from the Python step layout) are
written first, so the hashes see their current text; --check reports one that differs.

    python tools/build_shaders.py [--force] [--check] [--jobs N] [NAME ...]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine.backends.vulkan.ops_common import step_glsl  # noqa: E402
from engine.backends.vulkan.pipelines import SHADER_DIR, SPV_DIR, VARIANTS, Variant  # noqa: E402

# include files written from Python layouts: path -> its text
GENERATED = {SHADER_DIR / "include" / "step.glsl": step_glsl}

GLSLC_FLAGS = ["--target-env=vulkan1.2", "-O", "-fshader-stage=compute"]
# cooperative-matrix variants: SPIR-V 1.6 / Vulkan 1.3, built by a glslc that knows the
# extension (tools/modern_glslc.py finds or fetches one)
COOPMAT_FLAGS = ["--target-env=vulkan1.3", "-O", "-fshader-stage=compute"]


def needs_modern(v: Variant) -> bool:
    return "cooperative_matrix" in v.requires


def flags(v: Variant) -> list[str]:
    return COOPMAT_FLAGS if needs_modern(v) else GLSLC_FLAGS
MANIFEST = SPV_DIR / "manifest.json"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(path: Path, seen: set | None = None) -> list[Path]:
    """`path` and every file it includes, depth first, each once."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    out = [path]
    for inc in _INCLUDE.findall(path.read_text()):
        out += sources((path.parent / inc).resolve(), seen)
    return out


def stale_generated() -> list[Path]:
    """Generated includes whose file text differs from what their layout generates."""
    return [p for p, text in GENERATED.items() if not p.exists() or p.read_text() != text()]


def write_generated() -> None:
    for p in stale_generated():
        p.write_text(GENERATED[p]())
        print(f"wrote {p.relative_to(REPO)}")


def variant_hash(v: Variant) -> str:
    h = hashlib.sha256()
    for p in sorted(sources((SHADER_DIR / v.shader).resolve()), key=lambda p: str(p)):
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update("\0".join(v.define_args() + flags(v)).encode())
    return h.hexdigest()


def compile_variant(v: Variant, glslc: str) -> tuple[str, str | None]:
    cmd = [glslc, *flags(v), *v.define_args(), str(SHADER_DIR / v.shader), "-o", str(v.spv_path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return v.name, (r.stderr or r.stdout or "glslc failed") if r.returncode else None


def load_manifest() -> dict:
    try:
        return json.loads(MANIFEST.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def stale_variants(manifest: dict | None = None) -> list[str]:
    """Names whose .spv is missing or whose sources changed since it was built."""
    manifest = load_manifest() if manifest is None else manifest
    out = []
    for name, v in VARIANTS.items():
        entry = manifest.get(name)
        if not v.spv_path.exists() or entry is None or entry.get("hash") != variant_hash(v):
            out.append(name)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="variants to build (default: all stale)")
    ap.add_argument("--force", action="store_true", help="rebuild everything")
    ap.add_argument("--check", action="store_true", help="only report stale variants (exit 1 if any)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)

    if args.check:
        generated = stale_generated()
        for p in generated:
            print(f"stale generated include: {p.relative_to(REPO)}")
        stale = stale_variants()
        for n in stale:
            print(f"stale: {n}")
        return 1 if stale or generated else 0
    write_generated()
    manifest = load_manifest()
    stale = stale_variants(manifest)
    glslc = shutil.which("glslc")
    if glslc is None:
        print("glslc not found: install it (Debian: apt-get install glslc)", file=sys.stderr)
        return 2
    todo = args.names or (list(VARIANTS) if args.force else stale)
    modern = None
    if any(needs_modern(VARIANTS[n]) for n in todo if n in VARIANTS):
        import modern_glslc
        try:
            modern = modern_glslc.find()
        except (subprocess.CalledProcessError, RuntimeError, FileNotFoundError) as exc:
            print(f"no glslc with GL_KHR_cooperative_matrix (tools/modern_glslc.py): {exc}", file=sys.stderr)
            return 2

    def compiler(v: Variant) -> str:
        return modern if needs_modern(v) else glslc
    unknown = [n for n in todo if n not in VARIANTS]
    if unknown:
        print(f"unknown variants: {unknown}", file=sys.stderr)
        return 2
    SPV_DIR.mkdir(parents=True, exist_ok=True)
    failed = 0
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for name, err in pool.map(lambda n: compile_variant(VARIANTS[n], compiler(VARIANTS[n])), todo):
            v = VARIANTS[name]
            if err:
                failed += 1
                print(f"FAILED {name}:\n{err}", file=sys.stderr)
                continue
            manifest[name] = {"hash": variant_hash(v), "shader": v.shader,
                              "defines": v.define_args(), "bytes": v.spv_path.stat().st_size}
            print(f"built {name}")
    # drop entries (and files) of variants that no longer exist
    for name in list(manifest):
        if name not in VARIANTS:
            manifest.pop(name)
            (SPV_DIR / f"{name}.spv").unlink(missing_ok=True)
    MANIFEST.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    print(f"{len(todo) - failed} built, {failed} failed, {len(VARIANTS)} variants")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
