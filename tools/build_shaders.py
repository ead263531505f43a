"""Compile every pipeline variant to SPIR-V: the product's table (engine/backends/vulkan/pipelines.py)
to shaders/spv/, the benchmarks' probes (bench/shaders/__init__.py) to bench/shaders/spv/.

Each variant's hash covers its shader source, every file it includes (recursively), its -D
defines (the generated push-constant block among them) and the compiler flags. The hashes go
to the manifest.json beside the .spv files; tests/vulkan/test_shaders_fresh.py fails when a
committed .spv no longer matches its sources. Only stale variants are rebuilt unless --force.

Generated includes (`GENERATED`: shaders/include/step.glsl from the Python step layout) are
written first, so the hashes see their current text; --check reports one that differs.

    python -m tools.build_shaders [--force] [--check] [--jobs N] [NAME ...]
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

from bench.shaders import VARIANTS as BENCH_VARIANTS
from phoenix_chat.engine.backends.vulkan.ops_common import step_glsl
from phoenix_chat.engine.backends.vulkan.pipelines import VARIANTS as PRODUCT_VARIANTS
from phoenix_chat.engine.backends.vulkan.variants import Variant
from phoenix_chat.shaders import SHADER_DIR

REPO = Path(__file__).resolve().parents[1]

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


def _one_table(*tables: dict[str, Variant]) -> dict[str, Variant]:
    out: dict[str, Variant] = {}
    for table in tables:
        twice = set(out) & set(table)
        if twice:
            raise ValueError(f"pipeline variants declared twice: {sorted(twice)}")
        out.update(table)
    return out


VARIANTS = _one_table(PRODUCT_VARIANTS, BENCH_VARIANTS)
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
    for p in sorted(sources(v.source.resolve()), key=lambda p: str(p)):
        h.update(str(p.relative_to(REPO)).encode() + b"\0" + p.read_bytes() + b"\0")
    h.update("\0".join(v.define_args() + flags(v)).encode())
    return h.hexdigest()


def compile_variant(v: Variant, glslc: str) -> tuple[str, str | None]:
    cmd = [glslc, *flags(v), *v.define_args(), str(v.source), "-o", str(v.spv_path)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return v.name, (r.stderr or r.stdout or "glslc failed") if r.returncode else None


def spv_dirs() -> list[Path]:
    """Every folder the variants' SPIR-V goes to (each has its own manifest.json)."""
    return sorted({v.spv_path.parent for v in VARIANTS.values()})


def load_manifest() -> dict:
    """{name: entry} of every manifest.json, for the variants whose SPIR-V is in that folder."""
    out = {}
    for folder in spv_dirs():
        try:
            entries = json.loads((folder / "manifest.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        out.update({n: e for n, e in entries.items() if n in VARIANTS and VARIANTS[n].spv_path.parent == folder})
    return out


def write_manifests(manifest: dict) -> None:
    """Each variant's entry into the manifest.json beside its .spv."""
    for folder in spv_dirs():
        mine = {n: e for n, e in manifest.items() if VARIANTS[n].spv_path.parent == folder}
        (folder / "manifest.json").write_text(json.dumps(dict(sorted(mine.items())), indent=1) + "\n")


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
        from tools import modern_glslc

        try:
            modern = modern_glslc.find()
        except (subprocess.CalledProcessError, RuntimeError, FileNotFoundError) as exc:
            print(f"no glslc with GL_KHR_cooperative_matrix (tools.modern_glslc): {exc}", file=sys.stderr)
            return 2

    def compiler(v: Variant) -> str:
        return modern if needs_modern(v) else glslc

    unknown = [n for n in todo if n not in VARIANTS]
    if unknown:
        print(f"unknown variants: {unknown}", file=sys.stderr)
        return 2
    for folder in spv_dirs():
        folder.mkdir(parents=True, exist_ok=True)
    failed = 0
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for name, err in pool.map(lambda n: compile_variant(VARIANTS[n], compiler(VARIANTS[n])), todo):
            v = VARIANTS[name]
            if err:
                failed += 1
                print(f"FAILED {name}:\n{err}", file=sys.stderr)
                continue
            manifest[name] = {
                "hash": variant_hash(v),
                "shader": v.shader,
                "defines": v.define_args(),
                "bytes": v.spv_path.stat().st_size,
            }
            print(f"built {name}")
    # drop entries (and files) of variants that no longer exist
    for folder in spv_dirs():
        for spv in folder.glob("*.spv"):
            if VARIANTS.get(spv.stem) is None or VARIANTS[spv.stem].spv_path != spv:
                manifest.pop(spv.stem, None)
                spv.unlink()
    write_manifests(manifest)
    print(f"{len(todo) - failed} built, {failed} failed, {len(VARIANTS)} variants")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
