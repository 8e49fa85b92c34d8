#!/usr/bin/env bash
# The key of a source tree's build (tools/prebuild_sides.sh, tools/device_patches.sh): one hash
# over the contents of what an install compiles and copies, the CUDA/C++ sources, the package and
# the build files, so that a prebuilt side is used only on the very tree it was built from.
#   bash tools/side_key.sh TREE
set -euo pipefail
cd "$1"
find ffi jaxgemv CMakeLists.txt pyproject.toml -type f ! -name '*.pyc' ! -name '*.so' ! -path '*/__pycache__/*' -print0 |
  LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
