"""GLSL compute sources (one .comp per kernel family, include/) and their committed SPIR-V (spv/).

A package so that a wheel carries the SPIR-V the Vulkan backend loads (package data in
pyproject.toml); `python -m tools.build_shaders` compiles the sources into spv/.
"""

from pathlib import Path

SHADER_DIR = Path(__file__).resolve().parent
SPV_DIR = SHADER_DIR / "spv"
