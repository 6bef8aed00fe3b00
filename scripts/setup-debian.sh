#!/usr/bin/env bash
# One-time set-up of a fresh Debian (bookworm) machine, as root, from the repository root:
# the Vulkan loader, lavapipe (Mesa's CPU Vulkan driver, so kbench runs without a GPU), glslang,
# SPIRV-Tools and the Khronos validation layers from Debian; Chromium (the report's screenshot test); Python, a virtual environment in
# .venv with nox, and kbench itself. Safe to run again (it only adds what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(libvulkan1 mesa-vulkan-drivers vulkan-tools glslang-tools spirv-tools vulkan-validationlayers
      python3 python3-venv python3-pip git ca-certificates
      chromium)  # headless, for the test that screenshots the HTML report (tests/test_report_html.py)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

py=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$py" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip nox
.venv/bin/python -m pip install -q -e '.[test]'
# The oldest declared Python (3.10) for `nox -s tests-3.10`: Debian bookworm has none and uv's
# interpreter downloads are not reachable from CI, so nox takes python3.10 from PATH or a pyenv
# build (the CI image has one); say so when neither is there (the session then fails with that).
.venv/bin/python -c 'import sys; sys.path.insert(0, "."); import noxfile; sys.exit(noxfile.oldest_python() is None)' \
  || echo "setup: no Python 3.10 found (PATH, ~/.pyenv/versions); set KBENCH_PYTHON_OLDEST to one for nox -s tests-3.10" >&2
echo "kbench set up: $(.venv/bin/python -c 'import kbench; print(kbench.__version__)'); Vulkan devices:"
.venv/bin/kbench devices 2>/dev/null || vulkaninfo --summary 2>/dev/null | grep -E "deviceName|driverName" || true
