#!/usr/bin/env bash
# What compilers that headroom ends leave in TMPDIR (docs/decisions.md, fix 38). Each build
# runs 24 clang-19 HIP device compiles under `headroom build --jobs 1 -- make -j6`, so most
# jobs are queued and their early attempts ended (SIGTERM), which clang's driver does not
# clean up after. The odd-numbered compiles set a TMPDIR of their own step, which headroom
# leaves alone (as every compile was before fix 38); the even ones keep the build's, which
# headroom replaces with a directory of the session's. Prints, per build, the files left in
# each of the two temporary directories.
# Usage: bench/reliability/temp-files.sh [BUILDS]   (needs make and clang-19; a release build)
set -euo pipefail
cd "$(dirname "$0")/../.."
builds=${1:-5}
headroom=${HEADROOM:-$PWD/target/release/headroom}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp crates/headroom-kernels/src/prelude.h "$work/prelude.h"
cat > "$work/vector_add.cu" <<'EOF'
extern "C" __global__ void vector_add(float *o, const float *a, const float *b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) o[i] = a[i] + b[i];
}
EOF
cat > "$work/Makefile" <<'EOF'
all: $(foreach i,$(shell seq 1 24),k$(i).hsaco)
COMPILE = clang-19 -x hip --cuda-device-only --no-gpu-bundle-output -nogpulib -nogpuinc \
  -include prelude.h --offload-arch=gfx90a:xnack- -DK=$* vector_add.cu -o $@
k%.hsaco:
	@if [ $$(( $* % 2 )) = 1 ]; then TMPDIR=$(CURDIR)/own $(COMPILE); else $(COMPILE); fi
EOF
cd "$work"
mkdir -p build own state
echo "| build | left in the build's TMPDIR (12 compiles) | left in a TMPDIR the step chose (12 compiles) |"
echo "|---:|---:|---:|"
for build in $(seq 1 "$builds"); do
  rm -rf build/* own/* ./*.hsaco
  TMPDIR=$work/build HEADROOM_STATE_DIR=$work/state \
    "$headroom" build --jobs 1 -- make -s -j6 > "build-$build.log" 2>&1
  echo "| $build | $(ls build | wc -l) | $(ls own | wc -l) |"
done
