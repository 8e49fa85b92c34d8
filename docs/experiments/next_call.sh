#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main
# here, with the run tool's carry: [".prebuilt"]; limit 600 s):
#
#   bash docs/experiments/next_call.sh
#
# 1. The xshare variant's GPU tests (int4 and int8, both dtypes, both store forms) and one product
#    of each format under compute-sanitizer; 2. xshare against "mma" on the issues' shapes at M =
#    1-16, int4 and int8 (bf16 x) and int8 with fp16 x; 3. the two store forms by kernel (--kinds).
#    docs/perf-log.md, entry 150, says what each predicts.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
JAXGEMV_TEST_LIMIT=150 JAXGEMV_SIDES_TESTS="main:xshare" bash tools/device_patches.sh 2>&1 | tee "$out/tests.txt"
(
  cd /tmp && PYTHONPATH=/tmp/site-main timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 python3 -c '
import jax, jax.numpy as jnp, numpy as np, jaxgemv
for bits, product in ((4, jaxgemv.int4_matmul), (8, jaxgemv.int8_matmul)):
    for m, n, k in ((3, 1030, 1024), (13, 2051, 512)):
        rng = np.random.default_rng(m + bits)
        codes = rng.integers(0, 256, size=(n, k // 32, 32 * bits // 8), dtype=np.uint8)
        w = jaxgemv.NBitsWeight(jnp.asarray(codes), jnp.asarray(rng.uniform(0.1, 1, (n, k // 32)), jnp.bfloat16),
                                None, bits, 32, k)
        x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
        y = jax.jit(lambda x, w: product(x, w, variant="xshare"))(x, w)
        print(bits, m, n, k, bool(jnp.isfinite(y.astype(jnp.float32)).all()))
'
  echo "compute-sanitizer exit $?"
) 2>&1 | tail -12 | tee "$out/sanitizer.txt"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
JAXGEMV_SIDES_REUSE=1 JAXGEMV_SIDES_LIMIT=400 JAXGEMV_SIDES_RUN='
side main $B --format int4 --variant mma,xshare --shapes 8192x28672 34816x5120 5120x17408 10240x8192 \
  --m 1,2,4,8,16 | rows
side main $B --format int8 --variant mma,xshare --shapes 10240x8192 8192x28672 34816x5120 --m 1,2,4,8,16 | rows
side main $B --format int8_f16 --variant mma,xshare --shapes 10240x8192 8192x28672 --m 2,8,16 | rows
JAXGEMV_XSHARE_STORE=kernel side main $B --kinds --format int4 --variant xshare --shapes 8192x28672 34816x5120 \
  --m 8,16 | rows
side main $B --kinds --format int4 --variant xshare --shapes 8192x28672 34816x5120 --m 8,16 | rows
' bash tools/device_patches.sh 2>&1 | tee "$out/bench.txt"
