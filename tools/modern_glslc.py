#!/usr/bin/env python3
"""A glslc new enough for GL_KHR_cooperative_matrix, for `make shaders` on Debian 12.

Debian 12's glslc (shaderc 2023.2, glslang 11) predates the cooperative-matrix GLSL extension,
which only the prefill GEMM's coopmat variants need. This fetches Debian 13's glslc with the C
and C++ runtimes it was built against (`apt-get download`, no root, nothing installed
system-wide) into .toolchain/ and writes .toolchain/glslc, a wrapper that runs it through
that runtime's own loader. Only shader builds use it: the committed SPIR-V is what runs, and
tests/vulkan/test_shaders_fresh.py checks it by source hash, so CI needs no compiler at all.

    python -m tools.modern_glslc          # prints the wrapper's path (fetches once)

A system glslc that already understands the extension (Ubuntu 24.04+, Debian 13+, the Vulkan
SDK) is used instead when found; PHOENIX_GLSLC_COOPMAT names one explicitly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLCHAIN = REPO / ".toolchain"
WRAPPER = TOOLCHAIN / "glslc"
SUITE = "trixie"
PACKAGES = ["glslc", "libshaderc1", "libc6", "libstdc++6", "libgcc-s1"]
PROBE = """#version 450
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
void main() { coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a; }
"""


def understands_coopmat(glslc: str) -> bool:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.comp"
        src.write_text(PROBE)
        r = subprocess.run(
            [glslc, "--target-env=vulkan1.3", str(src), "-o", str(Path(d) / "p.spv")], capture_output=True, text=True
        )
        return r.returncode == 0


def apt_download(packages: list[str], debs: Path, suite: str = SUITE) -> list[Path]:
    """`apt-get download` Debian `suite`'s amd64 `packages` into `debs` (no root, nothing installed)."""
    state = TOOLCHAIN / f"apt-{suite}"
    lists = state / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    debs.mkdir(parents=True, exist_ok=True)
    sources = state / "sources.list"
    sources.write_text(f"deb http://deb.debian.org/debian {suite} main\n")
    apt = [
        "-o",
        f"Dir::Etc::SourceList={sources}",
        "-o",
        "Dir::Etc::SourceParts=/dev/null",
        "-o",
        f"Dir::State::Lists={lists}",
        "-o",
        "APT::Architecture=amd64",
        "-o",
        "Debug::NoLocking=1",
    ]
    subprocess.run(["apt-get", *apt, "update"], check=True, capture_output=True)
    subprocess.run(["apt-get", *apt, "download", *packages], check=True, capture_output=True, cwd=debs)
    return sorted(debs.glob("*.deb"))


def write_wrapper(root: Path, wrapper: Path) -> Path:
    """A script running `root`'s glslc through `root`'s own loader and C/C++ runtimes."""
    libdir = root / "usr/lib/x86_64-linux-gnu"
    loader = root / "usr/lib64/ld-linux-x86-64.so.2"
    wrapper.write_text(f'#!/bin/sh\nexec "{loader}" --library-path "{libdir}" "{root}/usr/bin/glslc" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def fetch() -> Path:
    """Download and unpack the packages into .toolchain/ and write the wrapper."""
    root = TOOLCHAIN / SUITE
    for deb in apt_download(PACKAGES, TOOLCHAIN / "debs"):
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    return write_wrapper(root, WRAPPER)


def find() -> str:
    """Path of a coopmat-capable glslc, fetching Debian 13's when nothing else will do."""
    explicit = os.environ.get("PHOENIX_GLSLC_COOPMAT")
    if explicit:
        return explicit
    system = shutil.which("glslc")
    if system and understands_coopmat(system):
        return system
    if WRAPPER.exists() and understands_coopmat(str(WRAPPER)):
        return str(WRAPPER)
    path = str(fetch())
    if not understands_coopmat(path):
        raise RuntimeError(f"{path} does not compile GL_KHR_cooperative_matrix")
    return path


if __name__ == "__main__":
    try:
        print(find())
    except (subprocess.CalledProcessError, RuntimeError, FileNotFoundError) as exc:
        print(f"no coopmat-capable glslc: {exc}", file=sys.stderr)
        sys.exit(2)
