#!/usr/bin/env bash
# Build ggml's test-backend-ops with its Vulkan backend, the binary `kbench bench --peer ggml` runs.
#
#   bash scripts/build-ggml-peer.sh [SRC_DIR]      (default: third_party/ggml, git-ignored)
#
# With network access SRC_DIR is cloned at the pinned commit; without it, put a checkout or a
# snapshot of ggml-org/ggml at that commit there first. Needs Debian's cmake, g++, glslc,
# libvulkan-dev and spirv-headers (installed below when missing, as root). Debian bookworm's
# Vulkan headers (1.3.239) predate VK_EXT_layer_settings, which ggml names: the overlay in
# scripts/ggml-peer/include supplies those three types. Bookworm's glslc (2023.2) lacks
# GL_KHR_cooperative_matrix, GL_NV_cooperative_matrix2 and GL_EXT_integer_dot_product, so the
# binary uses ggml's shaders without them (the configure step prints which). Two cores: about
# an hour, most of it compiling ggml's shader variants. The binary is static (no ggml .so files)
# and lands in third_party/ggml-bin/test-backend-ops; KBENCH_GGML_BIN or --ggml-bin point at it.
set -euo pipefail
cd "$(dirname "$0")/.."
GGML_REPO=https://github.com/ggml-org/ggml
GGML_COMMIT=d99724f2b141fed9e1a9f402213506c081433465
src=${1:-third_party/ggml}
out=third_party/ggml-bin

pkgs=(cmake g++ glslc libvulkan-dev spirv-headers git)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -d "$src" ]; then
  git clone -q "$GGML_REPO" "$src"
fi
if [ -d "$src/.git" ] || git -C "$src" rev-parse HEAD >/dev/null 2>&1; then
  have=$(git -C "$src" rev-parse HEAD)
  if [ "$have" != "$GGML_COMMIT" ]; then
    git -C "$src" checkout -q "$GGML_COMMIT"
  fi
fi
cmake -S "$src" -B "$src/build" -DGGML_VULKAN=ON -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_BUILD_TESTS=ON -DGGML_BUILD_EXAMPLES=OFF \
  -DVulkan_INCLUDE_DIR="$PWD/scripts/ggml-peer/include"
nice -n 10 cmake --build "$src/build" --target test-backend-ops -j "$(nproc)"
mkdir -p "$out"
cp "$src/build/bin/test-backend-ops" "$out/test-backend-ops"
strip "$out/test-backend-ops"
echo "built $out/test-backend-ops ($(du -h "$out/test-backend-ops" | cut -f1)) from ggml $GGML_COMMIT"
