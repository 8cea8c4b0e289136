#!/usr/bin/env bash
# farm.sh: headroom build with a build farm, against this machine alone and the engine alone
#
# Builds examples/template-heavy three ways, interleaved, REPEATS times. This machine runs
# each build inside a cgroup capped at LOCAL_CAP; the farm is two `distccd` daemons on
# loopback, each in a cgroup of its own capped at NODE_CAP, started afresh for every build:
#   local only      headroom build -- make -j8                   (no farm)
#   distcc alone    make -j8 CXX="distcc g++", DISTCC_HOSTS naming both nodes with
#                   NODE_SLOTS each, distcc's defaults (it falls back to a local compile)
#   headroom+farm   headroom build --farm NODE=NODE_MEMORY/NODE_SLOTS (both) -- make -j8
# Each run records wall time, exit status, OOM kills here and on each node, and how often
# distcc fell back to compiling here. It writes PREFIX.csv and PREFIX.md (medians, and the
# farm's speed-up over local only, paired within each repeat), and each build's output in
# PREFIX.logs/WAY-REPEAT.log, with where and when headroom ran each job.
#
# The nodes share this machine's cores: the farm adds memory, not CPU. Where memory allows
# only one heavy unit at a time here, it lets three run at once.
#
# Environment (all optional):
#   LOCAL_CAP=1.5G   NODE_CAP=1.5G   NODE_SLOTS=2   NODE_MEMORY (default NODE_CAP - 128M)
#   REPEATS=3       WAYS="local distcc farm" (a subset runs only those)
#   MAKE_VARS="HEAVY=6 HEAVY_MIB=1024 LIGHT=6 LIGHT_MIB=150"
#   HEADROOM=path    (default target/release/headroom)
#   RESULTS=prefix   (default bench/build/results/farm)
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
script_name=farm.sh
# shellcheck source=bench/build/cgroups.sh
source "$script_dir/cgroups.sh"

LOCAL_CAP=${LOCAL_CAP:-1.5G}
NODE_CAP=${NODE_CAP:-1.5G}
NODE_SLOTS=${NODE_SLOTS:-2}
REPEATS=${REPEATS:-3}
WAYS=${WAYS:-local distcc farm}
MAKE_VARS=${MAKE_VARS:-HEAVY=6 HEAVY_MIB=1024 LIGHT=6 LIGHT_MIB=150}
HEADROOM=${HEADROOM:-target/release/headroom}
RESULTS=${RESULTS:-$script_dir/results/farm}
[[ "$HEADROOM" == /* ]] || HEADROOM="$repo_root/$HEADROOM"
[[ -x "$HEADROOM" ]] || die "no headroom at $HEADROOM: build it with 'cargo build --release -p headroom' or set HEADROOM"
command -v distccd >/dev/null && command -v distcc >/dev/null ||
  skip "distcc is not installed (apt-get install distcc)"
local_bytes=$(size_to_bytes "$LOCAL_CAP")
node_bytes=$(size_to_bytes "$NODE_CAP")
NODE_MEMORY=${NODE_MEMORY:-$(((node_bytes - (128 << 20)) >> 20))M}
[[ "$NODE_SLOTS" =~ ^[1-9][0-9]*$ ]] || die "NODE_SLOTS must be a positive integer, got '$NODE_SLOTS'"
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer, got '$REPEATS'"

setup_cgroups
work_dir=$(mktemp -d)
trap cleanup EXIT
trap 'exit 130' INT TERM
# distccd runs compiles as `nobody`: the project must be readable by all.
chmod 755 "$work_dir"
project="$work_dir/project"
cp -r "$repo_root/examples/template-heavy" "$project"
chmod -R a+rX "$project"
state="$work_dir/state"
read -r -a make_vars <<<"$MAKE_VARS"

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts a node in a fresh cgroup capped at NODE_CAP; leaves its port in $port and its cgroup
# in $cgroup.
start_node() {
  make_cgroup "$node_bytes"
  port=$(free_port)
  bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' node "$cgroup" \
    distccd --no-detach --daemon --log-stderr --enable-tcp-insecure --allow 127.0.0.1 \
    --listen 127.0.0.1 --port "$port" --jobs "$NODE_SLOTS" 2>/dev/null &
  disown
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.05
  done
  die "distccd did not listen on port $port"
}

# Stops every process of cgroup $1 and removes it.
stop_cgroup() {
  local pid
  for _ in 1 2 3 4 5; do
    while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$1/cgroup.procs"
    rmdir "$1" 2>/dev/null && return 0
    sleep 0.2
  done
}

# Prints where and when each job of the report $1 ran, in the order they started.
timeline() {
  python3 - "$1" <<'PY'
import json, sys
jobs = sorted(json.load(open(sys.argv[1]))["jobs"], key=lambda job: job["start_ms"])
print("timeline: start s, end s, where, peak here, job")
for job in jobs:
    print(f'  {job["start_ms"] / 1000:6.1f} {job["end_ms"] / 1000:6.1f}  {job.get("node") or "here":<16}'
          f' {job["peak"] >> 20:5} MiB  {job["label"]}')
PY
}

csv="$RESULTS.csv"
mkdir -p "$(dirname "$csv")" "$RESULTS.logs"
echo "repeat,way,wall_s,exit,oom_here,oom_node1,oom_node2,local_fallbacks" >"$csv"

# Runs one build the way $2 says, for repeat $1, and appends its row.
run() {
  local repeat=$1 way=$2 node1 node2 port1 port2 here start end status=0 fallbacks
  start_node
  node1=$cgroup port1=$port
  start_node
  node2=$cgroup port2=$port
  make_cgroup "$local_bytes"
  here=$cgroup
  local -a build
  case "$way" in
  local) build=("$HEADROOM" build --report "$work_dir/report.json" -- make -j8 "${make_vars[@]}") ;;
  distcc) build=(env "DISTCC_HOSTS=127.0.0.1:$port1/$NODE_SLOTS 127.0.0.1:$port2/$NODE_SLOTS"
    "DISTCC_DIR=$work_dir/distcc-$repeat" make -j8 "${make_vars[@]}" "CXX=distcc g++") ;;
  farm) build=("$HEADROOM" build --report "$work_dir/report.json" --farm "127.0.0.1:$port1=$NODE_MEMORY/$NODE_SLOTS"
    --farm "127.0.0.1:$port2=$NODE_MEMORY/$NODE_SLOTS" -- make -j8 "${make_vars[@]}") ;;
  esac
  make -C "$project" clean >/dev/null
  mkdir -p "$work_dir/distcc-$repeat"
  start=$(date +%s.%N)
  HEADROOM_STATE_DIR=$state bash -c 'echo $$ >"$1/cgroup.procs" && cd "$2" && shift 2 && exec "$@"' \
    farm-run "$here" "$project" "${build[@]}" >"$work_dir/build.log" 2>&1 || status=$?
  end=$(date +%s.%N)
  fallbacks=$(grep -c "running locally instead" "$work_dir/build.log" || true)
  printf '%s,%s,%.1f,%s,%s,%s,%s,%s\n' "$repeat" "$way" "$(awk -v a="$start" -v b="$end" "BEGIN { print b - a }")" "$status" \
    "$(cgroup_oom_kills "$here")" "$(cgroup_oom_kills "$node1")" "$(cgroup_oom_kills "$node2")" \
    "$fallbacks" | tee -a "$csv" >&2
  [[ -f "$work_dir/report.json" ]] && timeline "$work_dir/report.json" >>"$work_dir/build.log"
  cp "$work_dir/build.log" "$RESULTS.logs/$way-$repeat.log"
  rm -f "$work_dir/report.json"
  for cgroup in "$here" "$node1" "$node2"; do stop_cgroup "$cgroup"; done
}

log "cgroup v$cgroup_version; here $LOCAL_CAP; 2 nodes of $NODE_CAP (declared $NODE_MEMORY/$NODE_SLOTS); mix: $MAKE_VARS; $REPEATS repeats"
for repeat in $(seq "$REPEATS"); do
  for way in $WAYS; do run "$repeat" "$way"; done
done

python3 - "$csv" "$RESULTS.md" "$LOCAL_CAP" "$NODE_CAP" "$NODE_MEMORY" "$NODE_SLOTS" "$MAKE_VARS" <<'PY'
import csv, statistics, sys
path, out, local_cap, node_cap, node_memory, slots, mix = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
ways = {"local": "local only: `headroom build -- make -j8`",
        "distcc": "distcc alone: `make -j8 CXX=\"distcc g++\"`",
        "farm": "headroom + farm: `headroom build --farm … -- make -j8`"}
lines = [f"template-heavy ({mix}); this machine capped at {local_cap}; 2 loopback distccd nodes capped at {node_cap} each "
         f"(declared {node_memory}/{slots}); {len({r['repeat'] for r in rows})} repeats, interleaved.", "",
         "| way | median wall (s) | failed builds | OOM kills here | OOM kills on nodes | distcc's local fallbacks |",
         "|---|---:|---:|---:|---:|---:|"]
for way, label in ways.items():
    runs = [r for r in rows if r["way"] == way]
    ok = [float(r["wall_s"]) for r in runs if r["exit"] == "0"]
    total = lambda key: sum(int(r[key]) for r in runs if r[key].isdigit())
    wall = f"{statistics.median(ok):.1f}" if ok else "—"
    lines.append(f"| {label} | {wall} | {len(runs) - len(ok)} of {len(runs)} | {total('oom_here')} | "
                 f"{total('oom_node1') + total('oom_node2')} | {total('local_fallbacks')} |")
pairs = {}
for r in rows:
    pairs.setdefault(r["repeat"], {})[r["way"]] = r
ratios = [float(p["local"]["wall_s"]) / float(p["farm"]["wall_s"]) for p in pairs.values()
          if p.get("local", {}).get("exit") == "0" and p.get("farm", {}).get("exit") == "0"]
if ratios:
    lines += ["", "headroom + farm against local only, paired: " + ", ".join(f"{r:.2f}×" for r in ratios)
              + f" faster (median {statistics.median(ratios):.2f}×)."]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
