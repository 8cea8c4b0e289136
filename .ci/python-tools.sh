# Shell helpers shared by the scripts that build and install wheels (.ci/wheel.sh,
# .ci/python.sh): their messages, prefixed with the script's name, and the interpreter that
# makes virtual environments ($PYTHON, else python3). Source it first; it expects `start`
# (the script's start, in $SECONDS) for `elapsed`.

script=$(basename "$0")
say() { echo "$script: $*"; }
fail() {
  echo "$script: FAILED: $*" >&2
  exit 1
}
elapsed() { echo "$((SECONDS - ${1:-$start})) s"; }

python="${PYTHON:-python3}"
command -v "$python" >/dev/null 2>&1 || fail "no $python on PATH (apt-get install python3 python3-venv)"

MATURIN_VERSION=1.16.0

# new_venv DIR: a fresh virtual environment in DIR. `python3 -m venv` needs ensurepip,
# which Debian ships in python3-venv (installed here when run as root).
new_venv() {
  local dir=$1
  rm -rf "$dir"
  if "$python" -m venv "$dir" >/dev/null 2>"$dir.err"; then
    rm -f "$dir.err"
    return
  fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ -z "${venv_retried:-}" ]; then
    venv_retried=1
    say "$python cannot make a virtual environment; installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null ||
      fail "apt-get install python3-venv failed"
    new_venv "$dir"
    return
  fi
  cat "$dir.err" >&2
  fail "$python -m venv $dir failed (on Debian: apt-get install python3-venv)"
}

# maturin_path: prints the path of maturin $MATURIN_VERSION, installing it from PyPI into a
# virtual environment under ~/.cache/headroom-wheel ($HEADROOM_WHEEL_CACHE) the first time;
# later runs reuse it. pip caches its downloads in ~/.cache/pip.
maturin_path() {
  local tools="${HEADROOM_WHEEL_CACHE:-$HOME/.cache/headroom-wheel}/maturin"
  if [ "$("$tools/bin/maturin" --version 2>/dev/null)" != "maturin $MATURIN_VERSION" ]; then
    say "installing maturin $MATURIN_VERSION into $tools" >&2
    mkdir -p "$(dirname "$tools")"
    new_venv "$tools" >&2
    "$tools/bin/pip" install -q "maturin==$MATURIN_VERSION" >&2 ||
      fail "pip could not install maturin $MATURIN_VERSION into $tools"
  fi
  echo "$tools/bin/maturin"
}

export PIP_DISABLE_PIP_VERSION_CHECK=1
