#!/usr/bin/env bash
# bash benchmarks/llama_source_pack.sh BACKEND DEST: the parts of llama-cpp-python's source distribution
# (vendor/llama.cpp; LLAMA_CPP_PYTHON_VERSION, default 0.3.36) that building llama-bench with ggml-BACKEND
# (vulkan, cuda) needs, as DEST/llama.cpp-BACKEND.tar.xz, and DEST/llama-cpp-python.version; DEST is
# git-ignored through .git/info/exclude. The sdist is 77 MB, over the 64 MiB that travels to the lent GPU
# machine: tools/CMakeLists.txt is replaced by one naming llama-bench only, and the backends other than
# ggml-cpu and ggml-BACKEND are left out. benchmarks/llama_vulkan_pack.sh and llama_cuda_h100.sh's header
# call it.
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND="${1:?usage: llama_source_pack.sh vulkan|cuda DEST}"
DEST="${2:?usage: llama_source_pack.sh vulkan|cuda DEST}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
grep -qx "/${DEST#./}/" "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
    || echo "/${DEST#./}/" >>"$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$DEST"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$work"
tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
cat >"$src/tools/CMakeLists.txt" <<'CM'
# only llama-bench (benchmarks/llama_source_pack.sh of the framework project replaced the tool list)
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
CM
excludes=()
for d in "$src"/ggml/src/ggml-*/; do
    b=$(basename "$d")
    case "$b" in ggml-cpu|"ggml-$BACKEND") ;; *) excludes+=(--exclude="llama.cpp/ggml/src/$b") ;; esac
done
tar -C "$(dirname "$src")" "${excludes[@]}" -cJf "$DEST/llama.cpp-$BACKEND.tar.xz" \
    llama.cpp/CMakeLists.txt llama.cpp/cmake llama.cpp/ggml llama.cpp/src llama.cpp/include llama.cpp/common \
    llama.cpp/vendor llama.cpp/tools/CMakeLists.txt llama.cpp/tools/llama-bench llama.cpp/LICENSE
echo "$VERSION" >"$DEST/llama-cpp-python.version"
ls -l "$DEST"
