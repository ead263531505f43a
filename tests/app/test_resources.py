"""resources/ is package data: the helper finds every file, and setuptools packages every one,
so a wheel install (no checkout around it) has its icon and themes."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import resources
from app.views import theme

ROOT = Path(__file__).resolve().parents[2]


def _files_in_folder() -> set[str]:
    folder = ROOT / "resources"
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc")}


def test_helper_resolves_every_resource_the_app_uses():
    assert set(resources.FILES) == _files_in_folder()      # a new file must be listed (and so tested)
    for name in resources.FILES:
        assert resources.path(name).is_file(), name
    for name in theme._COLORS:                              # apply_theme() loads themes/<name>.qss
        assert f"themes/{name}.qss" in resources.FILES


def test_setuptools_packages_every_resource_and_shader(tmp_path):
    # build_py is the step that fills a wheel: run it on a copy of the project (so egg_info writes
    # nowhere in the checkout) and look at what it built. Not a whole wheel: with this venv's
    # setuptools that needs the `wheel` package, and the test stays offline.
    src, lib = tmp_path / "src", tmp_path / "lib"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in ("resources", "shaders"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q",
                           "build_py", "--build-lib", str(lib)], cwd=src, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    built = {p.relative_to(lib).as_posix() for p in lib.rglob("*") if p.is_file()}
    assert {f"resources/{name}" for name in resources.FILES} | {"resources/__init__.py"} <= built
    # the SPIR-V of every pipeline variant the Vulkan backend can load
    from engine.backends.vulkan.pipelines import VARIANTS
    assert {f"shaders/spv/{name}.spv" for name in VARIANTS} | {"shaders/spv/manifest.json"} <= built
    # and nothing that is a probe, a test double or an evaluation script
    assert not [p for p in built if "probe" in p or "emulator" in p or "eval_" in p], sorted(built)
