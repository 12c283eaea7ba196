#!/usr/bin/env bash
# Here, once, in the repo's root: what benchmarks/llama_vulkan_h200.sh needs on the nvidia-h200 machine,
# in .llamavk/ (git-ignored through .git/info/exclude; carried with carry=[".gl", ".whl", ".llamavk"]):
#
# * llama.cpp-vulkan.tar.xz: the parts of llama-cpp-python 0.3.36's source distribution (vendor/llama.cpp)
#   that building llama-bench with the Vulkan backend needs (benchmarks/llama_source_pack.sh);
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
DEST=.llamavk
bash benchmarks/llama_source_pack.sh vulkan "$DEST"     # the source tarball (that script's header says what)
mkdir -p "$DEST/debs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

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
