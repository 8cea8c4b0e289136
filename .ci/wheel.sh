#!/usr/bin/env bash
# Builds headroom's wheel (pyproject.toml: the `headroom` binary, which carries its compiler
# shim and interceptor, as ruff and uv ship theirs), installs it into a fresh virtual environment with pip, and runs
# a governed build of examples/template-heavy with that `headroom` alone: no cargo, no
# rustc and no cargo target directory on PATH, as on a machine without Rust.
#
#   bash .ci/wheel.sh     # the wheel is left in target/wheels/ ($CARGO_TARGET_DIR/wheels)
#
# maturin comes from PyPI into a virtual environment under ~/.cache/headroom-wheel (moved
# by $HEADROOM_WHEEL_CACHE; .ci/python-tools.sh), reused by later runs; pip caches its
# downloads in ~/.cache/pip.
# The build is cargo's release build of crates/headroom (a few minutes on 2 cores the first
# time). Needs python3 with venv (Debian: python3-venv, installed here when run as root),
# g++, make and objdump (binutils, which g++ brings).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$SECONDS

# A small configuration of the example (README.md's full one takes minutes on 2 cores).
example_vars=(HEAVY=2 LIGHT=4 HEAVY_MIB=512 LIGHT_MIB=150)
units=6

# say, fail, elapsed, $python, new_venv and maturin_path, shared with .ci/python.sh.
. .ci/python-tools.sh
command -v cargo >/dev/null 2>&1 || fail "no cargo on PATH: building the wheel needs Rust (rustup)"
for tool in g++ make objdump; do
  command -v "$tool" >/dev/null 2>&1 || fail "no $tool on PATH (apt-get install g++ make binutils)"
done

# 1. maturin, reused while its version is the one in .ci/python-tools.sh.
maturin=$(maturin_path)

work="$(mktemp -d "${TMPDIR:-/tmp}/headroom-wheel.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# 2. The wheel: cargo's release build, stripped (pyproject.toml), tagged by maturin's
# auditwheel with the lowest manylinux the binaries allow.
t=$SECONDS
say "building the wheel (cargo build --release of crates/headroom)"
"$maturin" build --release --locked --out "$work/dist" ||
  fail "maturin build failed (see above)"
wheels=("$work"/dist/*.whl)
[ ${#wheels[@]} = 1 ] && [ -f "${wheels[0]}" ] || fail "maturin left no single wheel in $work/dist"
wheel=${wheels[0]}
name=$(basename "$wheel")
target_dir="${CARGO_TARGET_DIR:-$root/target}"
mkdir -p "$target_dir/wheels"
cp "$wheel" "$target_dir/wheels/"
say "built $name ($(du -h "$wheel" | cut -f1)) in $(elapsed "$t"); a copy is in $target_dir/wheels/"

# 3. A fresh virtual environment with only the wheel in it (it has no dependencies).
t=$SECONDS
venv="$work/venv"
new_venv "$venv"
"$venv/bin/pip" install -q --no-index "$wheel" || fail "pip install $name failed"
[ -x "$venv/bin/headroom" ] || fail "the wheel did not install headroom into the environment's bin/"
say "installed into a fresh virtual environment in $(elapsed "$t")"

# 4. PATH as on a machine without Rust: no cargo target directory, nothing with cargo,
# rustc or another headroom in it; the environment's bin/ first.
path="$venv/bin"
target_real=$(cd "$target_dir" && pwd -P)
IFS=: read -ra entries <<<"$PATH"
for entry in "${entries[@]}"; do
  [ -n "$entry" ] && [ -d "$entry" ] || continue
  real=$(cd "$entry" && pwd -P)
  case "$real/" in "$target_real/"*) continue ;; esac
  [ -e "$entry/cargo" ] || [ -e "$entry/rustc" ] || [ -e "$entry/headroom" ] && continue
  path="$path:$entry"
done
# headroom with that PATH, a fresh state directory (no build history) and no user settings.
run_path=$path
run() {
  env -u HEADROOM_CONFIG -u CARGO_TARGET_DIR PATH="$run_path" HEADROOM_STATE_DIR="$work/state" \
    XDG_CONFIG_HOME="$work/config" "$@"
}
[ "$(run sh -c 'command -v headroom')" = "$venv/bin/headroom" ] ||
  fail "headroom on the cleaned PATH is not the wheel's"
run sh -c '! command -v cargo && ! command -v rustc' >/dev/null ||
  fail "cargo or rustc is still on the cleaned PATH"
version=$(run headroom --version) || fail "the installed headroom does not run"
say "$version from the wheel; PATH has no cargo, rustc or target directory"

# 5. The governed build, from a copy of the example.
t=$SECONDS
cp -r examples/template-heavy "$work/template-heavy"
make -s -C "$work/template-heavy" clean >/dev/null
log="$work/build.log"
say "headroom build -- make -C <copy of examples/template-heavy> check ${example_vars[*]}"
set +e
(cd "$work" && run headroom build -- make -C template-heavy check "${example_vars[@]}") 2>&1 |
  tee "$log"
status=${PIPESTATUS[0]}
set -e
[ "$status" = 0 ] || fail "headroom build exited with $status (output above)"
grep -q "^units $units checksum" "$log" || fail "the example's check did not report its $units units"
summary=$(grep -E '^headroom: [0-9]+ jobs? in ' "$log" | tail -n 1) ||
  fail "headroom printed no summary line ('headroom: N jobs in ...')"
jobs=$(sed -E 's/^headroom: ([0-9]+) .*/\1/' <<<"$summary")
[ "$jobs" -ge "$units" ] ||
  fail "headroom governed $jobs jobs, fewer than the example's $units compiles: '$summary'"
if grep -E 'runs ungoverned|ran ungoverned|governed nothing' "$log"; then
  fail "part of the build ran ungoverned (above)"
fi
# The shim headroom carries, written into the state directory: a static program.
carried_shim() {
  local launcher
  launcher=$(readlink "$work/state/shims/headroom-launch") || fail "no headroom-launch in the state directory"
  case "$launcher" in
    "$work"/state/lib/shim-*/headroom-shim) ;;
    *) fail "compilers were led to $launcher, not to the shim headroom carries" ;;
  esac
  [ -x "$launcher" ] || fail "the shim $launcher is not executable"
  ! objdump -p "$launcher" | grep -q NEEDED || fail "the shim $launcher loads shared libraries"
}
carried_shim
say "governed $jobs jobs through the shim the wheel's headroom carries in $(elapsed "$t")"

# 6. Installed as pipx and uv install tools: headroom reached through a link in another
# bin/ still writes out its shim.
mkdir -p "$work/tool-bin"
ln -s "$venv/bin/headroom" "$work/tool-bin/headroom"
rm -rf "$work/state"
run_path="$work/tool-bin:$path"
run headroom build -- true >"$work/link.log" 2>&1 || {
  cat "$work/link.log" >&2
  fail "headroom build through a link failed"
}
carried_shim

# 7. auditwheel sees only the binary, not the interceptor that `headroom` carries
# inside it and preloads into every build process: its glibc must not be newer than the tag.
tag_glibc=$(sed -nE 's/.*-manylinux_([0-9]+)_([0-9]+)_[^-]*\.whl$/\1.\2/p' <<<"$name")
if [ -n "$tag_glibc" ]; then
  library=$(echo "$work"/state/lib/libheadroom-intercept-*.so)
  [ -f "$library" ] || fail "headroom wrote no interceptor library into $work/state/lib"
  needs=$(objdump -T "$library" | grep -oE 'GLIBC_[0-9]+\.[0-9]+' | sed 's/GLIBC_//' | sort -V | tail -n 1)
  [ "$(printf '%s\n%s\n' "$needs" "$tag_glibc" | sort -V | tail -n 1)" = "$tag_glibc" ] ||
    fail "the interceptor needs glibc $needs, newer than the wheel's tag (manylinux, glibc $tag_glibc)"
  say "the embedded interceptor needs glibc ${needs:-(none)}, within the tag's $tag_glibc"
else
  say "$name has no manylinux tag; skipping the interceptor's glibc check"
fi

say "OK: $name works without Rust ($(elapsed) in all)"
