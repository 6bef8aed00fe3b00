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
# 10 to 60 minutes, most of it compiling ggml's shader variants. The binary is static (no ggml .so files)
# and lands in third_party/ggml-bin/test-backend-ops; KBENCH_GGML_BIN or --ggml-bin point at it.
#
# The full-feature build (ggml's integer-dot, cooperative-matrix and coopmat2 shaders, the ones a
# user of a recent Vulkan SDK gets): set GLSLANG to a glslangValidator new enough for them (built
# as docs/shaders.md says) and VULKAN_HEADERS to a Vulkan-Headers tree of 1.4 with vulkan.hpp (for
# example Debian forky's libvulkan-dev unpacked with dpkg -x; the include/ folder under it). glslc's
# command line is then served by scripts/ggml-peer/glslc-on-glslang. That build goes to
# $SRC_DIR/build-full and third_party/ggml-bin-full/, with build.json beside the binary: the ggml
# commit, the shader compiler and the GLSL extensions ggml's configure step found, which the peer
# reads to name itself (kbench/bench/peer_ggml.py).
set -euo pipefail
cd "$(dirname "$0")/.."
GGML_REPO=https://github.com/ggml-org/ggml
GGML_COMMIT=d99724f2b141fed9e1a9f402213506c081433465
src=${1:-third_party/ggml}
out=third_party/ggml-bin
build=build
glslc_args=()
vk_include="$PWD/scripts/ggml-peer/include"
if [ -n "${GLSLANG:-}" ]; then
  : "${VULKAN_HEADERS:?the full-feature build needs VULKAN_HEADERS (a Vulkan-Headers tree with include/vulkan/vulkan.hpp)}"
  export GLSLANG
  out=third_party/ggml-bin-full
  build=build-full
  glslc_args=(-DVulkan_GLSLC_EXECUTABLE="$PWD/scripts/ggml-peer/glslc-on-glslang")
  vk_include="$VULKAN_HEADERS/include"
fi

pkgs=(cmake g++ glslc libvulkan-dev spirv-headers git)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ! -d "$src" ]; then
  git clone -q "$GGML_REPO" "$src"
fi
# only a checkout of its own: an exported snapshot inside this repository would otherwise answer with (and
# check out in) kbench's own history
if [ "$(git -C "$src" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$src" && pwd -P)" ]; then
  have=$(git -C "$src" rev-parse HEAD)
  if [ "$have" != "$GGML_COMMIT" ]; then
    git -C "$src" checkout -q "$GGML_COMMIT"
  fi
else
  echo "$src is not a git checkout: taken as a snapshot of ggml at $GGML_COMMIT"
fi
cmake -S "$src" -B "$src/$build" -DGGML_VULKAN=ON -DBUILD_SHARED_LIBS=OFF -DCMAKE_BUILD_TYPE=Release \
  -DGGML_NATIVE=OFF -DGGML_BUILD_TESTS=ON -DGGML_BUILD_EXAMPLES=OFF \
  -DVulkan_INCLUDE_DIR="$vk_include" "${glslc_args[@]}" 2>&1 | tee "$src/$build.configure.log"
nice -n 10 cmake --build "$src/$build" --target test-backend-ops -j "$(nproc)"
mkdir -p "$out"
cp "$src/$build/bin/test-backend-ops" "$out/test-backend-ops"
strip "$out/test-backend-ops"
# sed reads to the end: `head -1` would close the pipe early and glslc's SIGPIPE would end the script (pipefail)
if [ -n "${GLSLANG:-}" ]; then
  compiler="glslangValidator $("$GLSLANG" --version | sed -n '1s/.*[ :]//p')"
else
  compiler="glslc $(glslc --version 2>/dev/null | sed -n 1p)"
fi
python3 - "$out/build.json" "$GGML_COMMIT" "$compiler" "$src/$build.configure.log" <<'PY'
import json, re, sys
path, commit, compiler, log = sys.argv[1:]
text = open(log).read()
found = sorted(set(re.findall(r"-- (GL_\w+) supported by glslc", text)))
missing = sorted(set(re.findall(r"-- (GL_\w+) not supported by glslc", text)))
json.dump({"ggml_commit": commit, "shader_compiler": compiler, "glsl_extensions": found,
           "glsl_extensions_missing": missing}, open(path, "w"), indent=1)
PY
echo "built $out/test-backend-ops ($(du -h "$out/test-backend-ops" | cut -f1)) from ggml $GGML_COMMIT"
