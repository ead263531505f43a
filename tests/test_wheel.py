"""A wheel that works: `pip install` (not editable) of the built wheel into a fresh virtual
environment gives a `phoenix-chat` that reads the embedded model and generates, with its
SPIR-V and resources as package data and every import under `phoenix_chat.` (the generic
folder names app/ engine/ ... never reach site-packages as top-level packages)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from setuptools import find_packages

from phoenix_chat import resources
from phoenix_chat.engine.backends.vulkan.pipelines import VARIANTS

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("app", "engine", "npu", "resources", "shaders")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the sources (no build/ or egg-info in the checkout),
    offline: this environment's setuptools builds it (no build isolation)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for pkg in SOURCES:
        shutil.copytree(ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "build"))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(tmp / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (whl,) = (tmp / "dist").glob("phoenix_chat-*.whl")
    return whl


def test_wheel_holds_every_package_and_its_data_under_the_project_name(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {n.split("/")[0] for n in names if not n.startswith("phoenix_chat-")}
    assert top == {"phoenix_chat"}  # no top-level `app`, `engine`, `tests`, `bench`...
    # every package folder of the checkout is listed in pyproject.toml (setuptools cannot prefix them)
    for pkg in find_packages(str(ROOT), include=[f"{p}*" for p in SOURCES]):
        assert f"phoenix_chat/{pkg.replace('.', '/')}/__init__.py" in names, pkg
    assert {f"phoenix_chat/resources/{name}" for name in resources.FILES} <= names
    assert {f"phoenix_chat/shaders/spv/{name}.spv" for name in VARIANTS} <= names
    assert "phoenix_chat/shaders/spv/manifest.json" in names
    # and nothing that is a probe, a test double or an evaluation script
    assert not [n for n in names if "probe" in n or "emulator" in n or "eval_" in n], sorted(names)


def test_installed_wheel_runs_info_and_generates(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # the dependencies come from this environment's site-packages, added as plain path entries:
    # its .pth files (this checkout's editable install among them) are not processed that way
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    Path(site, "phoenix_deps.pth").write_text("\n".join(deps) + "\n")
    # the installed copy must be what runs: no PYTHONPATH of the caller's (a checkout) leaks in
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def run(*args: str) -> str:
        out = subprocess.run(
            [str(env_dir / "bin" / "phoenix-chat"), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    where = subprocess.run(
        [str(py), "-c", "import phoenix_chat.engine as e; print(e.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    assert Path(where.stdout.strip()).is_relative_to(env_dir)  # the installed copy, not this checkout
    assert "context length" in run("info")
    text = run(
        "run", "--raw", "--backend", "cpu", "--max-tokens", "4", "--temperature", "0", "The capital of France is"
    )
    assert text.strip(), "the installed app generated nothing"
