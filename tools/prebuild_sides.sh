#!/usr/bin/env bash
# Builds tools/device_patches.sh's sides here, for the lent machine's Python (3.12, sm_90, the
# same CUDA 13.0), so that a call spends its device time on tests and benchmarks instead of
# ~150 s of compiling: each side ("main", a patch's name or "a+b") is installed with
# `pip install --target` and packed as .prebuilt/NAME.tar.xz (about 7 MB each, sm_90 only), with
# .prebuilt/NAME.key naming the sources it was built from (tools/side_key.sh). Pass the folder to
# the run tool with carry [".prebuilt"]; device_patches.sh unpacks a side whose key matches the
# tree it runs on and builds the others as before.
#
#   JAXGEMV_PREBUILD_PYTHON=/path/to/python3.12 bash tools/prebuild_sides.sh main andor
#
# The Python needs jax (its FFI headers), nanobind and scikit-build-core; the builds run one
# after the other (each takes the machine's cores).
set -euo pipefail
py=${JAXGEMV_PREBUILD_PYTHON:-python3.12}
repo=$(pwd)
# A new workspace may come without them (session 63's did): the lent machine has jax 0.11.2, and
# the FFI headers must be its version's.
"$py" -c 'import jax, nanobind, scikit_build_core' 2>/dev/null || {
  echo "$py lacks jax / nanobind / scikit-build-core; install them first:"
  echo "  $py -m pip install 'jax==0.11.2' 'jaxlib==0.11.2' nanobind scikit-build-core"
  exit 1
}
mkdir -p "$repo/.prebuilt"
for name in "$@"; do
  start=$SECONDS
  work=$(mktemp -d /tmp/prebuild-XXXXXX)
  git -C "$repo" ls-files -z | (cd "$repo" && xargs -0 cp --parents -t "$work")
  cd "$work"
  if [ "$name" != main ]; then
    for part in ${name//+/ }; do
      GIT_CEILING_DIRECTORIES=/tmp git apply "$repo/docs/experiments/$part.patch"
    done
  fi
  key=$(bash "$repo/tools/side_key.sh" "$work")
  "$py" -m pip install --no-build-isolation --no-deps -q --target "$work/site" . \
    -C cmake.define.JAXGEMV_CUDA_ARCHITECTURES=90 -C build-dir="$work/build" >"$work/build.log" 2>&1 ||
    { tail -20 "$work/build.log"; echo "$name: build failed"; exit 1; }
  tar -C "$work/site" -cf - . | xz -T0 -6 >"$repo/.prebuilt/$name.tar.xz"
  echo "$key" >"$repo/.prebuilt/$name.key"
  cd "$repo" && rm -rf "$work"
  echo "$name: $((SECONDS - start)) s, $(du -h ".prebuilt/$name.tar.xz" | cut -f1), key $key"
done
