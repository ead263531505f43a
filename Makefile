# Phoenix Chat — `make run` starts the app on the embedded model, `make test` runs every test.
# Both set up everything on a fresh Debian/Ubuntu machine (system packages when run as root).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

APT_PACKAGES := libvulkan1 mesa-vulkan-drivers glslc xvfb xauth libxkbcommon-x11-0 libxcb-icccm4 \
  libxcb-image0 libxcb-keysyms1 libxcb-randr0 libxcb-render-util0 libxcb-xinerama0 libxcb-xkb1 \
  libxcb-shape0 libxcb-cursor0 libegl1 libgl1 libfontconfig1 libdbus-1-3 \
  g++ cmake   # g++/cmake: `make peer-server` compiles llama.cpp for the peer tests

PACKAGES := app engine npu shaders resources
LINTED := $(PACKAGES) tests bench tools

.PHONY: run test lint typecheck system-deps venv shaders bench clean peer-server convert-tools

run: $(STAMP)
	$(VENV)/bin/phoenix-chat

# two test processes (pytest-xdist), a file at a time each: a GUI or CLI test keeps one core busy
# on average and lavapipe ~1.6, so one process left ~a third of the machine idle. TEST_PROCESSES=
# (empty) runs one.
TEST_PROCESSES ?= -n 2 --dist loadfile
# ... and each process's BLAS (numpy's OpenBLAS: the CPU backend, the references) on one thread:
# its idle threads spin, so beside a lavapipe test a CPU-backend bench took 57-66 s with two
# threads and 37-44 s with one (lavapipe's own threads lose nothing to sharing the cores).
# With TEST_PROCESSES= set TEST_ENV= too.
TEST_ENV ?= OPENBLAS_NUM_THREADS=1

# lint, mypy and the two peer venvs are independent: built side by side (mypy takes one core for
# ~3 min while llama.cpp compiles), then the tests.
test:
	$(MAKE) -j3 lint typecheck peer-server convert-tools
	@mkdir -p build && rm -f build/test-times.tsv build/test-pipelines.tsv
	$(TEST_ENV) PHOENIX_TEST_TIMES=build/test-times.tsv PHOENIX_TEST_PIPELINES=$(CURDIR)/build/test-pipelines.tsv QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -ra --durations=15 $(TEST_PROCESSES)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)

# mypy reads the packages under their installed names (phoenix_chat.engine, ...): the editable
# install maps them with an import hook mypy cannot follow, so a folder of links stands in.
typecheck: $(STAMP)
	@rm -rf build/typecheck && mkdir -p build/typecheck/phoenix_chat
	@for p in $(PACKAGES); do ln -s ../../../$$p build/typecheck/phoenix_chat/$$p; done
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml $(addprefix -p phoenix_chat.,$(PACKAGES))

system-deps:
	@if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	  missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	  if [ -n "$$missing" ]; then echo "installing:$$missing"; apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi; \
	else \
	  echo "note: not root; if something is missing install: sudo apt-get install $(APT_PACKAGES)"; \
	fi

$(STAMP): pyproject.toml
	$(MAKE) system-deps
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip 'setuptools>=77'   # the SPDX license string in pyproject.toml
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# llama.cpp's own OpenAI-compatible server, a real peer for the remote-engine tests and the server
# load bench (tools/llama_cpp_server.py): built from the PyPI sdist in a venv of its own (its
# FastAPI/pydantic pins stay out of ours); ~5 min on 2 cores, once.
PEER_VENV := build/llama-cpp-server
PEER_STAMP := $(PEER_VENV)/.installed
LLAMA_CPP_PYTHON_VERSION := 0.3.36

peer-server: $(PEER_STAMP)

$(PEER_STAMP): | $(STAMP)
	$(PYTHON) -m venv $(PEER_VENV)
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PEER_VENV)/bin/pip install -q 'llama-cpp-python[server]==$(LLAMA_CPP_PYTHON_VERSION)'
	touch $(PEER_STAMP)

# llama.cpp's own HF -> GGUF converter (convert_hf_to_gguf.py, from the same llama-cpp-python sdist,
# unpacked by tools/convert_with_llama_cpp.py into build/llama-cpp-source) needs torch: a tools-only
# venv (torch 2.13.0 CPU; transformers as llama.cpp's requirements pin it; protobuf new enough for
# sentencepiece's generated module). tests/test_mmproj.py converts the tiny vision model with it.
CONVERT_VENV := build/llama-cpp-convert
CONVERT_STAMP := $(CONVERT_VENV)/.installed

convert-tools: $(CONVERT_STAMP)

$(CONVERT_STAMP): | $(STAMP)
	$(PYTHON) -m venv $(CONVERT_VENV)
	$(CONVERT_VENV)/bin/pip install -q torch==2.13.0
	$(CONVERT_VENV)/bin/pip install -q 'transformers==4.57.6' 'sentencepiece>=0.1.98,<0.3.0' \
	  'protobuf>=7.36.1' numpy safetensors
	$(PY) -c 'from tools.convert_with_llama_cpp import llama_cpp_source; llama_cpp_source()'
	touch $(CONVERT_STAMP)

shaders:
	$(PY) -m tools.build_shaders

bench: $(STAMP)
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) build *.egg-info
