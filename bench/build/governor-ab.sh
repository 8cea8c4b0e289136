#!/usr/bin/env bash
# Two builds of headroom's governor side by side: each binary serves a session of its own, and
# the same shim calls each in turn (alternate.py), with a direct `true` beside them, three times
# in each order, since a call that follows another waits for the governor that served it.
# Both sessions run without a CPU cgroup (HEADROOM_CPU_CGROUP=0): the calls come from outside
# them, and moving each into a build's cgroup would cost more than what is measured. With
# `busy`, a `make -j2` loop over examples/template-heavy loads the host meanwhile.
# Usage: bench/build/governor-ab.sh BEFORE AFTER [quiet|busy] [RUNS]   (two headroom binaries)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] && [ -x "$1" ] && [ -x "$2" ] || { echo "usage: $0 BEFORE AFTER [quiet|busy] [RUNS]"; exit 2; }
binaries=("$(realpath "$1")" "$(realpath "$2")")
host=${3:-quiet}
runs=${4:-150}
work=$(mktemp -d)
groups=()
cleanup() {
  for group in "${groups[@]}"; do kill -- "-$group" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
ln -s "$(type -P true)" "$work/direct-true"
commands=()
for i in 0 1; do
  dir=$work/governor-$i
  mkdir -p "$dir/launcher"
  HEADROOM_CPU_CGROUP=0 HEADROOM_STATE_DIR=$dir/state setsid "${binaries[$i]}" build -- \
    bash -c "env > '$dir/env'; sleep 3600" >/dev/null 2>&1 &
  groups+=($!)
  for _ in $(seq 100); do [ -s "$dir/env" ] && break; sleep 0.1; done
  ln -s "$(readlink "$dir/state/shims/headroom-launch")" "$dir/launcher/headroom-launch"
  variables=$(grep -E '^HEADROOM_(SOCKET|SESSION|SHIM_DIR|FARM)=' "$dir/env" | tr '\n' ' ')
  commands+=("env $variables $dir/launcher/headroom-launch $work/direct-true")
done
if [ "$host" = busy ]; then
  cp -r examples/template-heavy "$work/load"
  setsid bash -c 'cd "$1" && while :; do make -s -j2 HEAVY=0 LIGHT=8 >/dev/null 2>&1; make -s clean >/dev/null; done' \
    load "$work/load" &
  groups+=($!)
  sleep 5
fi
for repeat in 1 2 3; do
  for order in "before after" "after before"; do
    set -- $order
    variant() { [ "$1" = before ] && echo "before=${commands[0]}" || echo "after=${commands[1]}"; }
    python3 bench/build/alternate.py "$runs" "$work/r.json" direct="env $work/direct-true" \
      "$(variant "$1")" "$(variant "$2")"
    python3 -c 'import json, sys
r = {x["command"]: x["median"] * 1e3 for x in json.load(open(sys.argv[1]))["results"]}
d, b, a = r["direct"], r["before"], r["after"]
print(f"{sys.argv[2]} {sys.argv[3]:<13} direct {d:.2f} ms  before {b:.2f} ms  after {a:.2f} ms")' \
      "$work/r.json" "$host" "$(echo $order | tr ' ' '>')"
  done
done
