#!/usr/bin/env bash
# benchmarks/vulkan_h200.sh in two (or more) trees in one device call, one after the other, ROUNDS times
# interleaved (A, B, A, B, ...): before/after figures from the same machine. Each tree is a directory in the
# repo's root holding a copy of a tree's framework/ and benchmarks/ (ignored by git, carried with .gl and
# .whl); the carried loaders and wheels are linked into each.
#
# Here, for the trees to compare (e.g. main's and this checkout's):
#   echo /.vkbase/ >>.git/info/exclude; echo /.vkhost/ >>.git/info/exclude
#   mkdir -p .vkbase .vkhost; git archive main framework benchmarks pyproject.toml | tar -x -C .vkbase
#   tar -c --exclude=__pycache__ framework benchmarks pyproject.toml | tar -x -C .vkhost
# Then, through the device tool (every argument goes to vulkan_h200.sh):
#   run(command='TREES=".vkbase .vkhost" ROUNDS="1 2" bash .vkhost/benchmarks/vulkan_h200_ab.sh --skip-matvec '
#               '--skip-matmul --skip-torch --skip-check --conformance none --runs 5',
#       carry=[".gl", ".whl", ".vkbase", ".vkhost"], kind="nvidia-h200")
# Logs: $OUT/<tree>-<round>/vulkan_h200.log; each tree's run is cut at EACH seconds (default 200).
set -u
cd "$(dirname "$0")/../.."
root=$(pwd)
OUT="${OUT:-/tmp/vulkan_h200_ab}"
for tree in ${TREES:?TREES names the trees, e.g. TREES=".vkbase .vkhost"}; do
    ln -sfn "$root/.gl" "$tree/.gl"
    ln -sfn "$root/.whl" "$tree/.whl"
done
for round in ${ROUNDS:-1}; do
    for tree in $TREES; do
        name=${tree#.}
        echo "=== $name round $round"
        (cd "$tree" && OUT="$OUT/$name-$round" VULKAN_H200_TIMEOUT="${EACH:-200}" bash benchmarks/vulkan_h200.sh "$@" \
            >/dev/null 2>&1; echo "rc $?")
        grep -E "decode host|vulkan:0 prefill|^smollm2|^gemma3|conformance|Traceback|Error" \
            "$OUT/$name-$round/vulkan_h200.log" | cut -c1-600
    done
done
