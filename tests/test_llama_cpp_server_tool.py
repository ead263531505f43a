"""tools/llama_cpp_server.py's python(): the peer server counts as built only once `make
peer-server` has stamped its venv (Makefile's PEER_STAMP). The venv's python exists from the
build's first step, so a build in progress or one that failed in pip would otherwise make the
llama.cpp tests ERROR with "No module named llama_cpp" instead of the fixture's skip/CI failure."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import llama_cpp_server as peer


@pytest.fixture
def venv(tmp_path, monkeypatch):
    root = tmp_path / "llama-cpp-server"
    monkeypatch.setattr(peer, "VENV", root)
    monkeypatch.setattr(peer, "STAMP", root / ".installed")
    monkeypatch.delenv("PHOENIX_LLAMA_CPP_PYTHON", raising=False)
    return root


def half_built(root: Path) -> Path:
    exe = root / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.touch()
    return exe


def test_the_stamp_is_the_makefiles():
    makefile = (Path(peer.__file__).resolve().parents[1] / "Makefile").read_text()
    venv = re.search(r"^PEER_VENV := (.+)$", makefile, re.M).group(1).strip()
    stamp = re.search(r"^PEER_STAMP := (.+)$", makefile, re.M).group(1).strip()
    assert stamp == "$(PEER_VENV)/.installed" and peer.VENV == peer.REPO / venv
    assert peer.STAMP == peer.VENV / ".installed"


def test_not_built(venv):
    assert peer.python() is None


def test_a_venv_without_the_stamp_is_not_built(venv):
    half_built(venv)
    assert peer.python() is None
    with pytest.raises(FileNotFoundError, match=r"run `make peer-server` \(no .*\.installed\)"):
        with peer.running("model.gguf"):
            pass


def test_a_stamped_venv_is_built(venv):
    exe = half_built(venv)
    (venv / ".installed").touch()
    assert peer.python() == exe


def test_a_named_interpreter_needs_no_stamp(venv, tmp_path, monkeypatch):
    other = tmp_path / "elsewhere" / "python"
    monkeypatch.setenv("PHOENIX_LLAMA_CPP_PYTHON", str(other))
    assert peer.python() is None
    other.parent.mkdir()
    other.touch()
    assert peer.python() == other
