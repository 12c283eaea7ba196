#!/usr/bin/env bash
# Here, once, in the repo's root: what benchmarks/llama_cuda_h100.sh needs on the lent GPU machine, in
# .llamacu/ (git-ignored through .git/info/exclude; carried with carry=[".gl", ".whl", ".llamacu"]):
# llama.cpp-cuda.tar.xz, the parts of llama-cpp-python 0.3.36's source distribution (vendor/llama.cpp)
# that building llama-bench with the CUDA backend needs (the sdist is 77 MB, over the 64 MiB that travels):
# tools/CMakeLists.txt replaced by one naming llama-bench only, the backends other than ggml-cpu and
# ggml-cuda left out. The GPU machine has nvcc, CMake and Ninja; it reaches no package registry.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DEST=.llamacu
grep -qx '/.llamacu/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
    || echo /.llamacu/ >>"$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$work"
tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
cat >"$src/tools/CMakeLists.txt" <<'CM'
# only llama-bench (benchmarks/llama_cuda_pack.sh of the framework project replaced the tool list)
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
CM
excludes=()
for d in "$src"/ggml/src/ggml-*/; do
    b=$(basename "$d")
    case "$b" in ggml-cpu|ggml-cuda) ;; *) excludes+=(--exclude="llama.cpp/ggml/src/$b") ;; esac
done
tar -C "$(dirname "$src")" "${excludes[@]}" -cJf "$DEST/llama.cpp-cuda.tar.xz" \
    llama.cpp/CMakeLists.txt llama.cpp/cmake llama.cpp/ggml llama.cpp/src llama.cpp/include llama.cpp/common \
    llama.cpp/vendor llama.cpp/tools/CMakeLists.txt llama.cpp/tools/llama-bench llama.cpp/LICENSE
echo "$VERSION" >"$DEST/llama-cpp-python.version"
ls -l "$DEST"
