"""Shared fixtures: the real embedded model, opened once per session; NPU emulator kernels."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

SHARED_REFERENCE = Path(__file__).resolve().parents[1].parent / "shared" / "reference" / "llama_cpp_270m.json"
GOLDENS = Path(__file__).resolve().parent / "goldens"


@pytest.fixture(scope="session", autouse=True)
def _isolated_home(tmp_path_factory):
    """Keep tokenizer caches and app data of the test run out of the user's folders. Each test's
    load times its own kernel choices: a record of an earlier test's load (tuning_record.py) would
    make what a test sees depend on the order tests ran in; its own tests turn it on by option."""
    home = tmp_path_factory.mktemp("phoenix-home")
    os.environ["PHOENIX_CHAT_HOME"] = str(home)
    os.environ["PHOENIX_VULKAN_TUNING_RECORD"] = "0"
    yield home


@pytest.fixture(scope="module", autouse=True)
def _return_memory_after_each_module():
    """Give the memory of a module's models back to the OS when it ends. Freed numpy buffers stay
    in glibc's heaps (and a cycle or two keeps some until a collection), so the session's RSS only
    grew: a 24 GiB machine ran out of memory two thirds into the suite. gc + malloc_trim after each
    module left 0.15 GB where 1.2 GB stayed (test_batching.py alone)."""
    yield
    from phoenix_chat.engine.heap import release_freed_memory

    release_freed_memory()


@pytest.fixture(scope="session")
def model_path() -> Path:
    from phoenix_chat.engine.weights import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="session")
def draft_path(tmp_path_factory, model_path) -> Path:
    """The real 270M cut to its first 12 of 18 layers: a speculative-decoding draft with the
    same tokenizer that disagrees with the full model often enough to exercise rejections."""
    from .tinymodels import truncated_gguf

    return truncated_gguf(model_path, tmp_path_factory.mktemp("draft") / "gemma3-270m-12-layers.gguf", 12)


@pytest.fixture(scope="session")
def gguf(model_path):
    from phoenix_chat.engine.weights.gguf_file import GGUFFile

    return GGUFFile(model_path)


@pytest.fixture(scope="session")
def npu_test_kernels(tmp_path_factory) -> Path:
    """A folder of emulator stand-in kernels, one per default GEMM spec (shared: copy it to alter it)."""
    from phoenix_chat.npu.kernels.spec import DEFAULT_SPECS
    from tests.npu.emulator import write_test_kernel

    folder = tmp_path_factory.mktemp("npu-kernels")
    for spec in DEFAULT_SPECS:
        write_test_kernel(folder, spec)
    return folder


@pytest.fixture(scope="session")
def cpu_model(model_path):
    from phoenix_chat import engine

    return engine.load(model_path, backend="cpu", context_length=2048)


@pytest.fixture(scope="session")
def llama_reference() -> dict:
    if not SHARED_REFERENCE.exists():
        pytest.skip(f"{SHARED_REFERENCE} not present (it lives beside the checkout)")
    return json.loads(SHARED_REFERENCE.read_text())


LLAMA_CPP_MODEL_ID = "gemma-3-270m-llama.cpp"  # the id llama.cpp's server reports for the embedded GGUF


@pytest.fixture(scope="module")
def llama_cpp_log(tmp_path_factory) -> Path:
    """Where the module's llama.cpp server writes its output (as it comes)."""
    return tmp_path_factory.mktemp("llama-cpp-server") / "server.log"


def llama_cpp_disconnects(log: Path) -> int:
    """How many streams llama.cpp's server has seen its client close (it stops generating then)."""
    return log.read_text(errors="replace").count("Disconnected from client (via refresh/close)") if log.exists() else 0


@pytest.fixture(scope="module")
def llama_cpp_server(model_path, llama_cpp_log):
    """llama.cpp's own OpenAI-compatible server (llama-cpp-python[server], built by `make
    peer-server`) on the embedded GGUF, CPU, 127.0.0.1: a real third-party server, not a double.
    Yields its base URL (the API under /v1); its output goes to `llama_cpp_log`. Missing in CI is
    a failure; elsewhere a skip that says how to build it."""
    from tools import llama_cpp_server as peer

    if peer.python() is None:
        message = f"llama.cpp's server is not built (run `make peer-server`; no {peer.STAMP})"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    # --chat_format gemma: the embedded GGUF carries no chat template, and without one llama-cpp-python
    # renders Llama 2's (every chat answer empty); interrupt_requests off: by default a new request cuts
    # off the stream in progress.
    extra = ["--chat_format", "gemma", "--interrupt_requests", "False"]
    with peer.running(
        model_path, n_ctx=2048, threads=2, model_alias=LLAMA_CPP_MODEL_ID, extra_args=extra, log=llama_cpp_log
    ) as url:
        yield url


def pytest_runtest_logreport(report) -> None:
    """Append each test phase's seconds to $PHOENIX_TEST_TIMES as it ends (`make test` sets it to
    build/test-times.tsv; columns: seconds, phase, outcome, test, xdist
    worker, RSS MB): pytest's --durations prints only when the run ends, and a CI run stopped
    by its time limit ends without them — the one run whose profile is most needed."""
    path = os.environ.get("PHOENIX_TEST_TIMES")
    if path and getattr(report, "node", None) is None:  # under xdist the controller sees each report again
        worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
        with open(path, "a", encoding="utf-8") as times:
            times.write(
                f"{report.duration:.3f}\t{report.when}\t{report.outcome}\t{report.nodeid}\t{worker}\t{_rss_mb()}\n"
            )


def pytest_configure(config) -> None:
    path = os.environ.get("PHOENIX_TEST_PIPELINES")
    if path:
        _log_new_pipelines(path)


def _log_new_pipelines(path: str) -> None:
    """Append each pipeline this process asks for the first time to $PHOENIX_TEST_PIPELINES
    (`make test`: build/test-pipelines.tsv; columns: unix time, test, xdist worker, lavapipe's
    vector width, variant, specialization): on a CI machine every new pipeline is an LLVM compile
    for lavapipe (Mesa's shader cache starts empty), most of the Vulkan tests' time. The first line
    of a (variant, specialization, width) in the whole file is the test that paid for its compile.
    A wrapper that records and calls the real method: nothing it returns is changed."""
    import time

    from phoenix_chat.engine.backends.vulkan.pipelines import PipelineCache

    real_get = PipelineCache.get
    seen: set[tuple[str, tuple[tuple[str, int], ...], int]] = set()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    width = os.environ.get("LP_NATIVE_VECTOR_WIDTH", "-")

    def get(self, name: str, **spec: int):
        p = real_get(self, name, **spec)
        # the values it was built with (defaults filled in, a required subgroup size apart), as the
        # cache keys it: callers that spell one pipeline's constants differently log it once
        key = (name, tuple(sorted(p.spec_values.items())), p.subgroup_size)
        if key not in seen:
            seen.add(key)
            test = os.environ.get("PYTEST_CURRENT_TEST", "-").split(" ")[0]
            built = {**dict(key[1]), **({"SUBGROUP_SIZE": key[2]} if key[2] else {})}
            with open(path, "a", encoding="utf-8") as log:
                log.write(f"{time.time():.3f}\t{test}\t{worker}\t{width}\t{name}\t{built}\n")
        return p

    PipelineCache.get = get  # type: ignore[method-assign]


def _rss_mb() -> int:
    """This process's resident memory in MB (the times file's last column: two test processes
    share the machine's memory)."""
    import psutil

    return int(psutil.Process().memory_info().rss // 2**20)
