#!/usr/bin/env bash
# Here, once, in the repo's root: what benchmarks/llama_vulkan_h200.sh needs on the nvidia-h200 machine,
# in .llamavk/ (git-ignored through .git/info/exclude; carried with carry=[".gl", ".whl", ".llamavk"]):
#
# * llama.cpp-vulkan.tar.xz: the parts of llama-cpp-python 0.3.36's source distribution (vendor/llama.cpp)
#   that building llama-bench with the Vulkan backend needs (the sdist is 77 MB, over the 64 MiB that
#   travels); tools/CMakeLists.txt is replaced by one naming llama-bench only, and the other backends'
#   folders are left out (GGML_CUDA and the rest are off);
# * Debian packages of the Vulkan SDK's parts, from unstable (sid; LLAMAVK_VK_SUITE picks another suite):
#   the Vulkan 1.4.363 headers (libvulkan-dev; Debian 12's 1.3.239 lack vk::LayerSettingEXT, which this
#   ggml-vulkan uses), the loader they match, the SPIR-V headers, and glslc 2026.4 (glslang 16.4) with
#   libshaderc1. Debian 12's glslc lacks GL_KHR_cooperative_matrix, GL_NV_cooperative_matrix2 and
#   GL_EXT_integer_dot_product, so llama.cpp would build only its fallback shaders; Debian 13's (2025.2)
#   has those but lacks GL_EXT_bfloat16 and GL_NV_cooperative_matrix_decode_vector, which sid's has;
# * Debian 13 (trixie)'s libc6, libstdc++6 and libgcc-s1: those binaries need C library 2.38, so where the
#   machine's is older (here, 2.36, for a dry run) glslc runs through trixie's own dynamic loader.
#   Everything is unpacked under /opt/llamavk there, never over /.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
DEST=.llamavk
grep -qx '/.llamavk/' "$(git rev-parse --git-common-dir)/info/exclude" 2>/dev/null \
    || echo /.llamavk/ >>"$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$DEST/debs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pip download -q --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$work"
tar -xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
cat >"$src/tools/CMakeLists.txt" <<'EOF'
# only llama-bench (benchmarks/llama_vulkan_pack.sh of the framework project replaced the tool list)
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
EOF
keep_backends=(ggml-cpu ggml-vulkan)
excludes=()
for d in "$src"/ggml/src/ggml-*/; do
    b=$(basename "$d")
    [[ " ${keep_backends[*]} " == *" $b "* ]] || excludes+=(--exclude="llama.cpp/ggml/src/$b")
done
tar -C "$(dirname "$src")" "${excludes[@]}" -cJf "$DEST/llama.cpp-vulkan.tar.xz" \
    llama.cpp/CMakeLists.txt llama.cpp/cmake llama.cpp/ggml llama.cpp/src llama.cpp/include llama.cpp/common \
    llama.cpp/vendor llama.cpp/tools/CMakeLists.txt llama.cpp/tools/llama-bench llama.cpp/LICENSE
echo "$VERSION" >"$DEST/llama-cpp-python.version"

# Debian's package lists of other suites in a private apt state, so the system's (bookworm) stays as it is
fetch() {   # SUITE PACKAGE...
    local suite=$1; shift
    local d="$work/apt-$suite"
    mkdir -p "$d/lists/partial" "$d/cache/archives/partial" "$d/parts" "$d/prefs"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" \
        >"$d/sources.list"
    local o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists="$d/lists"
             -oDir::Etc::SourceList="$d/sources.list" -oDir::Etc::SourceParts="$d/parts"
             -oDir::Cache="$d/cache" -oDir::Etc::PreferencesParts="$d/prefs")
    apt-get "${o[@]}" -qq update
    (cd "$DEST/debs" && apt-get "${o[@]}" -qq download "$@" 2>&1 | grep -v 'Download is performed unsandboxed' || true)
}
rm -f "$DEST"/debs/*.deb
fetch "${LLAMAVK_VK_SUITE:-sid}" libvulkan-dev libvulkan1 spirv-headers glslc libshaderc1
fetch trixie libc6 libstdc++6 libgcc-s1
ls -l "$DEST" "$DEST/debs"
du -sh "$DEST"
