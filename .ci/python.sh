#!/usr/bin/env bash
# The headroom-mem Python package (crates/headroom-mem-py): builds its wheel with maturin,
# installs it into a fresh virtual environment with NumPy and pytest, and runs the pytest
# suite there; then installs it again the way a user with a checkout does,
# `pip install ./crates/headroom-mem-py`, and runs the suite once more.
#
#   bash .ci/python.sh    # the wheel is left in target/wheels/ ($CARGO_TARGET_DIR/wheels)
#
# torch (for the DLPack and memory_viz tests) is not installed again: the environment sees
# the one .ci/cuda.sh keeps in ~/.cache/headroom-ci/venv ($HEADROOM_CUDA_ENV) through a .pth
# file; without it those tests skip and say why. maturin is .ci/python-tools.sh's; pip
# caches NumPy, pytest and maturin's build environment in ~/.cache/pip.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$SECONDS

# say, fail, elapsed, $python, new_venv and maturin_path, shared with .ci/wheel.sh.
. .ci/python-tools.sh
command -v cargo >/dev/null 2>&1 || fail "no cargo on PATH: building the extension needs Rust (rustup)"
maturin=$(maturin_path)
package=crates/headroom-mem-py

work="$(mktemp -d "${TMPDIR:-/tmp}/headroom-python.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# 1. The wheel: one abi3 wheel for every CPython from 3.9, with the `cuda` feature
# (pyproject.toml), which loads the driver at run time and so builds without CUDA.
t=$SECONDS
say "building the headroom-mem wheel"
"$maturin" build --release --locked -m "$package/Cargo.toml" --out "$work/dist" ||
  fail "maturin build failed (see above)"
wheels=("$work"/dist/*.whl)
[ ${#wheels[@]} = 1 ] && [ -f "${wheels[0]}" ] || fail "maturin left no single wheel in $work/dist"
wheel=${wheels[0]}
target_dir="${CARGO_TARGET_DIR:-$root/target}"
mkdir -p "$target_dir/wheels"
cp "$wheel" "$target_dir/wheels/"
say "built $(basename "$wheel") in $(elapsed "$t")"

# 2. A fresh environment with NumPy, pytest and the wheel.
venv="$work/venv"
new_venv "$venv"
"$venv/bin/pip" install -q numpy pytest || fail "pip could not install numpy and pytest"
"$venv/bin/pip" install -q --no-index "$wheel" || fail "pip install $(basename "$wheel") failed"

# torch is hundreds of MB with its CUDA wheels: rather than installing it again, a .pth file
# (site.py appends each line of one to sys.path) adds the site-packages of .ci/cuda.sh's
# environment after this one's own, so `import torch` finds it while NumPy, pytest and
# headroom_mem still come from here. Only an environment of the same Python version fits.
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
version=$("$venv/bin/python" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
torch_site="${HEADROOM_CUDA_ENV:-$HOME/.cache/headroom-ci}/venv/lib/$version/site-packages"
if [ -d "$torch_site/torch" ]; then
  echo "$torch_site" >"$site/headroom-ci-torch.pth"
  say "torch from $torch_site"
else
  say "no torch for $version in $torch_site (run .ci/cuda.sh); the torch tests will skip"
fi

# run_suite LABEL: the pytest suite against the installed package, from outside the source
# tree so `import headroom_mem` cannot pick up crates/headroom-mem-py/python.
run_suite() {
  local label=$1 t=$SECONDS
  (cd "$work" && "$venv/bin/python" - <<'PY') || fail "$label: the installed headroom_mem is not the environment's"
import sys, headroom_mem
assert headroom_mem.__file__.startswith(sys.prefix), headroom_mem.__file__
assert headroom_mem.CUDA, "the wheel lacks the cuda feature"
PY
  cp -r "$root/$package/tests" "$work/tests"
  (cd "$work" && "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests) ||
    fail "$label: pytest failed (above)"
  rm -rf "$work/tests"
  say "$label: pytest passed in $(elapsed "$t")"
}
run_suite "wheel"

# 3. From the checkout, as the README shows: pip builds it with maturin in an isolated build
# environment, into the same cargo target directory as step 1.
t=$SECONDS
"$venv/bin/pip" uninstall -q -y headroom-mem
"$venv/bin/pip" install -q "./$package" || fail "pip install ./$package failed"
say "pip install ./$package in $(elapsed "$t")"
run_suite "checkout"

say "OK ($(elapsed) in all)"
