#!/usr/bin/env bash
# farm-flash-attn.sh: flash-attention's real-nvcc subset on an sccache-dist farm, three ways
#
# Builds the flash-attention 2.8.3 subset of caps.sh (flash_api.cpp and four sm_80 forward
# kernels, `pip install --no-build-isolation .` through torch's cpp_extension and the PyPI
# nvcc 13.2) three ways, interleaved, REPEATS times. This machine runs each build inside a
# cgroup capped at LOCAL_CAP; each of the two loopback nodes is an `sccache-dist server`
# (bubblewrap builder) in a cgroup capped at NODE_CAP:
#   local only     headroom build -- pip install ...                   (no farm)
#   sccache alone  pip install ... with MAX_JOBS=4 and sccache on PATH, which torch's
#                  cpp_extension then puts before every compiler; one scheduler for both
#                  servers, as users run it (it places jobs by cores, and falls back to
#                  compiling here)
#   headroom+farm  headroom build --farm-engine sccache-dist, each node its own scheduler
# Every compile really runs (SCCACHE_RECACHE=1). Each run records wall time, exit status,
# OOM kills and peaks here and on each node, and how often sccache compiled here after a
# node failed it. It writes PREFIX.csv and PREFIX.md (medians, and the farm's speed-up over
# local only, paired within each repeat), and each build's output in PREFIX.logs/.
#
# The nodes share this machine's cores: the farm adds memory, not CPU. sccache is on PATH
# for all three ways; headroom sets TORCH_NO_COMPILER_WRAPPER=1 for its builds by itself, so
# that torch does not hand its compiles to a local sccache daemon, outside headroom's jobs.
#
# Environment (all optional):
#   LOCAL_CAP=6G   NODE_CAP=6G   NODE_MEMORY (default NODE_CAP - 256M)   REPEATS=1
#   WAYS="local sccache farm"   TIMEOUT=1500 (seconds; a build still running is killed)
#   HEADROOM=path (default target/release/headroom)   RESULTS=prefix (default
#   bench/build/results/farm-flash-attn)
# Needs: bash .ci/cuda.sh (nvcc, torch) and bash .ci/farm.sh (sccache, bubblewrap); root.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
script_name=farm-flash-attn.sh
# shellcheck source=bench/build/cgroups.sh
source "$script_dir/cgroups.sh"

LOCAL_CAP=${LOCAL_CAP:-6G}
NODE_CAP=${NODE_CAP:-6G}
REPEATS=${REPEATS:-1}
WAYS=${WAYS:-local sccache farm}
TIMEOUT=${TIMEOUT:-1500}
HEADROOM=${HEADROOM:-target/release/headroom}
RESULTS=${RESULTS:-$script_dir/results/farm-flash-attn}
[[ "$HEADROOM" == /* ]] || HEADROOM="$repo_root/$HEADROOM"
[[ -x "$HEADROOM" ]] || die "no headroom at $HEADROOM: build it with 'cargo build --release -p headroom' or set HEADROOM"
torch_env=${HEADROOM_CUDA_ENV:-$HOME/.cache/headroom-ci}
farm_bin=${HEADROOM_FARM_ENV:-$HOME/.cache/headroom-farm}/venv/bin
[[ -x "$torch_env/venv/bin/python" && -x "$torch_env/cuda-home/bin/nvcc" ]] ||
  skip "no nvcc and torch in $torch_env (bash .ci/cuda.sh)"
[[ -x "$farm_bin/sccache-dist" ]] || skip "no sccache in $farm_bin (bash .ci/farm.sh)"
command -v bwrap >/dev/null || skip "bubblewrap is not installed (apt-get install bubblewrap)"
[[ $(id -u) == 0 ]] || skip "sccache-dist's build servers need root"
local_bytes=$(size_to_bytes "$LOCAL_CAP")
node_bytes=$(size_to_bytes "$NODE_CAP")
NODE_MEMORY=${NODE_MEMORY:-$(((node_bytes - (256 << 20)) >> 20))M}
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer, got '$REPEATS'"

setup_cgroups
work_dir=$(mktemp -d)
trap 'stop_daemons; cleanup' EXIT
trap 'exit 130' INT TERM
project="$work_dir/project"
mkdir -p "$project"
# shellcheck source=bench/build/flash-attn-source.sh
source "$script_dir/flash-attn-source.sh"
unpack_flash_attn_subset "$project"
export CUDA_HOME="$torch_env/cuda-home" SCCACHE_RECACHE=1 SCCACHE_DIR="$work_dir/sccache-cache"
export PATH="$torch_env/venv/bin:$farm_bin:$PATH" HEADROOM_STATE_DIR="$work_dir/state"
unset MAKEFLAGS MFLAGS MAKELEVEL
token=bench

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

wait_port() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  die "nothing listens on port $1"
}

daemons=()
stop_daemons() {
  local pid
  for pid in "${daemons[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  daemons=()
}

# Starts a scheduler on a fresh port, left in $port.
start_scheduler() {
  port=$(free_port)
  printf 'public_addr = "127.0.0.1:%s"\n[client_auth]\ntype = "token"\ntoken = "%s"\n[server_auth]\ntype = "token"\ntoken = "%s-server"\n' \
    "$port" "$token" "$token" >"$work_dir/scheduler-$port.toml"
  sccache-dist scheduler --config "$work_dir/scheduler-$port.toml" >>"$work_dir/daemons.log" 2>&1 &
  daemons+=($!)
  disown
  wait_port "$port"
}

# Starts a server for the scheduler on port $1, in a fresh cgroup capped at NODE_CAP, left
# in $cgroup.
start_server() {
  local server_port dir
  make_cgroup "$node_bytes"
  server_port=$(free_port)
  dir="$work_dir/server-$server_port"
  mkdir -p "$dir/build"
  printf 'cache_dir = "%s/toolchains"\npublic_addr = "127.0.0.1:%s"\nbind_address = "127.0.0.1:%s"\nscheduler_url = "http://127.0.0.1:%s"\n[builder]\ntype = "overlay"\nbuild_dir = "%s/build"\nbwrap_path = "%s"\n[scheduler_auth]\ntype = "token"\ntoken = "%s-server"\n' \
    "$dir" "$server_port" "$server_port" "$1" "$dir" "$(command -v bwrap)" "$token" >"$dir/server.toml"
  bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' node "$cgroup" \
    sccache-dist server --config "$dir/server.toml" >>"$work_dir/daemons.log" 2>&1 &
  daemons+=($!)
  disown
  wait_port "$server_port"
  # The scheduler counts a server once it has heard from it.
  for _ in $(seq 100); do
    [[ $(python3 -c 'import struct, sys, urllib.request; print(struct.unpack("<Q", urllib.request.urlopen(sys.argv[1]).read()[:8])[0])' \
      "http://127.0.0.1:$1/api/v1/scheduler/status") -ge $2 ]] && return 0
    sleep 0.1
  done
  die "the server on port $server_port did not register with its scheduler"
}

peak_mib() { echo $(($(cgroup_peak_bytes "$1") >> 20)); }

csv="$RESULTS.csv"
mkdir -p "$(dirname "$csv")" "$RESULTS.logs"
echo "repeat,way,wall_s,exit,oom_here,oom_node1,oom_node2,peak_here_mib,peak_node1_mib,peak_node2_mib,local_fallbacks" >"$csv"

# Runs one build the way $2 says, for repeat $1, and appends its row.
run() {
  local repeat=$1 way=$2 node1 node2 here start end status=0 fallbacks
  local -a build
  case "$way" in
  sccache)
    start_scheduler
    local scheduler=$port
    start_server "$scheduler" 1
    node1=$cgroup
    start_server "$scheduler" 2
    node2=$cgroup
    printf '[dist]\nscheduler_url = "http://127.0.0.1:%s"\n[dist.auth]\ntype = "token"\ntoken = "%s"\n' \
      "$scheduler" "$token" >"$work_dir/client.toml"
    build=(env SCCACHE_CONF="$work_dir/client.toml" SCCACHE_SERVER_UDS="$work_dir/sccache-$repeat.sock"
      SCCACHE_LOG=warn MAX_JOBS=4 pip install --no-build-isolation --no-deps -v .)
    ;;
  local | farm)
    start_scheduler
    local port1=$port
    start_server "$port1" 1
    node1=$cgroup
    start_scheduler
    local port2=$port
    start_server "$port2" 1
    node2=$cgroup
    build=("$HEADROOM" build --report "$work_dir/report.json")
    [[ $way == farm ]] && build+=(--farm-engine sccache-dist --farm-token "$token"
      --farm "127.0.0.1:$port1=$NODE_MEMORY/1" --farm "127.0.0.1:$port2=$NODE_MEMORY/1")
    build+=(-- pip install --no-build-isolation --no-deps -v .)
    ;;
  esac
  make_cgroup "$local_bytes"
  here=$cgroup
  rm -rf "$project/build" "$project"/*.egg-info
  start=$(date +%s.%N)
  # The sccache client's daemon of `sccache alone` starts inside this cgroup, with the build.
  timeout --kill-after=10 "$TIMEOUT" bash -c 'echo $$ >"$1/cgroup.procs" && cd "$2" && shift 2 && exec "$@"' \
    farm-run "$here" "$project" "${build[@]}" >"$work_dir/build.log" 2>&1 || status=$?
  end=$(date +%s.%N)
  fallbacks=$(grep -c "falling back to local" "$work_dir/build.log" || true)
  printf '%s,%s,%.1f,%s,%s,%s,%s,%s,%s,%s,%s\n' "$repeat" "$way" "$(awk -v a="$start" -v b="$end" "BEGIN { print b - a }")" "$status" \
    "$(cgroup_oom_kills "$here")" "$(cgroup_oom_kills "$node1")" "$(cgroup_oom_kills "$node2")" \
    "$(peak_mib "$here")" "$(peak_mib "$node1")" "$(peak_mib "$node2")" "$fallbacks" | tee -a "$csv" >&2
  cp "$work_dir/build.log" "$RESULTS.logs/$way-$repeat.log"
  rm -f "$work_dir/report.json"
  # What the build left here (sccache alone's client daemon) goes with the daemons.
  while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$here/cgroup.procs"
  stop_daemons
  sleep 1
}

log "cgroup v$cgroup_version; here $LOCAL_CAP; 2 nodes of $NODE_CAP (declared $NODE_MEMORY/1); $REPEATS repeats"
for repeat in $(seq "$REPEATS"); do
  for way in $WAYS; do run "$repeat" "$way"; done
done

python3 - "$csv" "$RESULTS.md" "$LOCAL_CAP" "$NODE_CAP" "$NODE_MEMORY" <<'PY'
import csv, statistics, sys
path, out, local_cap, node_cap, node_memory = sys.argv[1:]
rows = list(csv.DictReader(open(path)))
names = {"local": "local only (headroom build)", "sccache": "sccache-dist alone",
         "farm": "headroom + sccache-dist farm"}
lines = [f"flash-attention 2.8.3 subset (flash_api.cpp + four sm_80 kernels, real nvcc 13.2); here {local_cap}, "
         f"2 sccache-dist nodes of {node_cap} (declared {node_memory}/1); {len({r['repeat'] for r in rows})} repeat(s)", "",
         "| way | median wall s | failed builds | OOM kills here / nodes | peak here / nodes MiB | local fallbacks |",
         "|---|---:|---:|---:|---:|---:|"]
for way in ("local", "sccache", "farm"):
    runs = [r for r in rows if r["way"] == way]
    if not runs:
        continue
    ok = [float(r["wall_s"]) for r in runs if r["exit"] == "0"]
    wall = f"{statistics.median(ok):.1f}" if ok else "—"
    failed = sum(r["exit"] != "0" for r in runs)
    here = sum(int(r["oom_here"]) for r in runs)
    nodes = sum(int(r["oom_node1"]) + int(r["oom_node2"]) for r in runs)
    peaks = f'{max(int(r["peak_here_mib"]) for r in runs)} / {max(max(int(r["peak_node1_mib"]), int(r["peak_node2_mib"])) for r in runs)}'
    fallbacks = sum(int(r["local_fallbacks"]) for r in runs)
    lines.append(f"| {names[way]} | {wall} | {failed} of {len(runs)} | {here} / {nodes} | {peaks} | {fallbacks} |")
by = {(r["repeat"], r["way"]): r for r in rows}
ratios = [float(by[(rep, "local")]["wall_s"]) / float(by[(rep, "farm")]["wall_s"])
          for rep in sorted({r["repeat"] for r in rows})
          if (rep, "local") in by and (rep, "farm") in by
          and by[(rep, "local")]["exit"] == "0" and by[(rep, "farm")]["exit"] == "0"]
if ratios:
    lines += ["", f"headroom + farm against local only: {statistics.median(ratios):.2f}x by the median "
              f"(paired: {', '.join(f'{r:.2f}' for r in ratios)})"]
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
