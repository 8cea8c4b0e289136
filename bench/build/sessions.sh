#!/usr/bin/env bash
# sessions.sh: several headroom builds at once on one machine, under one memory cap.
#
# K copies of examples/template-heavy (`make HEAVY=2 LIGHT=2`: two ~1 GiB units and two
# light ones each) build at the same time inside one memory-limited cgroup, three ways:
#   shared    K `headroom build -- make` with one state directory: they join one governor
#             and share its budget and slots (what headroom does now);
#   separate  the same with a state directory each and no XDG_RUNTIME_DIR, so each starts a
#             governor of its own that takes the room it sees as its budget (what every build
#             did before sessions shared a governor);
#   users     the first build as root, the others as the user nobody (uid 65534), sharing a
#             state directory: one governor per user, which leave each other what they hold
#             through the ledger;
#   union     one `headroom build -- make` of one tree with K times the units, the yardstick.
# Each run is warm (one unmeasured build per mode first teaches the history). Prints each
# run's wall, exit codes, the kernel's OOM kills in the cgroup and headroom's own kills
# (requeues in the reports), then the medians with wall ratios to union.
#
# Usage: bench/build/sessions.sh [K...]     e.g. `bench/build/sessions.sh 2 4`
# Environment: CAP (default 2.2G: two heavy units fit, four do not), REPEATS (default 2),
#              MODES (default "shared separate users union"),
#              HEADROOM (default target/release/headroom).
set -euo pipefail
script_name=sessions.sh
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
# shellcheck source=bench/build/cgroups.sh
source "$script_dir/cgroups.sh"
CAP=${CAP:-2.2G}
REPEATS=${REPEATS:-2}
HEADROOM=${HEADROOM:-$repo_root/target/release/headroom}
sessions=("${@:-2}")
[[ -x $HEADROOM ]] || die "no headroom at $HEADROOM: build it with 'cargo build --release -p headroom'"
setup_cgroups
work_dir=$(mktemp -d "${TMPDIR:-/tmp}/headroom-sessions.XXXXXX")
trap cleanup EXIT
# The other user's builds read the example and the binary from here.
chmod 755 "$work_dir"
cap_bytes=$(size_to_bytes "$CAP")
results="$work_dir/results.csv"
echo "k,mode,repeat,wall_s,exits,oom_kills,requeues" >"$results"

# A copy of the example in $1, with `make clean` done.
copy() {
  rm -rf "$1"
  cp -r "$repo_root/examples/template-heavy" "$1"
}

# Runs the builds "DIR STATE USER VARS" given one per argument at once in a fresh cgroup, which it
# removes after; leaves "wall exits oom requeues" in $line.
run_together() {
  make_cgroup "$cap_bytes"
  local start end pids=() exits="" requeues=0 spec dir state vars
  start=$EPOCHREALTIME
  for spec in "$@"; do
    read -r dir state user vars <<<"$spec"
    make -C "$dir" clean >/dev/null
    # Without a runtime directory, a governor's place is in the state directory.
    local as=(env -u XDG_RUNTIME_DIR)
    if [[ $user != root ]]; then
      mkdir -p "$state"
      chown -R "$user" "$dir" "$state"
      as=(setpriv --reuid="$user" --regid="$user" --clear-groups env -u XDG_RUNTIME_DIR HOME="$state")
    fi
    # shellcheck disable=SC2086 # vars are make assignments
    HEADROOM_STATE_DIR=$state bash -c 'echo $$ >"$1/cgroup.procs" && cd "$2" && shift 2 && exec "$@"' \
      sessions-run "$cgroup" "$dir" "${as[@]}" "$HEADROOM" build --report report.json -- make $vars \
      >"$dir.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    local status=0
    wait "$pid" || status=$?
    exits+="$status/"
  done
  end=$EPOCHREALTIME
  for spec in "$@"; do
    read -r dir _ <<<"$spec"
    requeues=$((requeues + $(python3 -c 'import json,sys; print(sum(j["requeues"] for j in json.load(open(sys.argv[1]))["jobs"]))' "$dir/report.json" 2>/dev/null || echo 0)))
  done
  line=$(awk -v s="$start" -v e="$end" -v x="${exits%/}" -v o="$(cgroup_oom_kills "$cgroup")" -v r="$requeues" \
    'BEGIN { printf "%.1f %s %s %s\n", e - s, x, o, r }')
  rmdir "$cgroup" || log "could not remove $cgroup; remove it by hand with rmdir"
}

for k in "${sessions[@]}"; do
  specs_shared=() specs_separate=() specs_users=()
  for ((i = 1; i <= k; i++)); do
    copy "$work_dir/k$k-$i"
    copy "$work_dir/users-k$k-$i"
    specs_shared+=("$work_dir/k$k-$i $work_dir/state-shared-k$k root HEAVY=2 LIGHT=2")
    specs_separate+=("$work_dir/k$k-$i $work_dir/state-k$k-$i root HEAVY=2 LIGHT=2")
    user=root
    ((i > 1)) && user=65534
    specs_users+=("$work_dir/users-k$k-$i $work_dir/state-users-k$k-$user $user HEAVY=2 LIGHT=2")
  done
  copy "$work_dir/union-k$k"
  spec_union="$work_dir/union-k$k $work_dir/state-union-k$k root HEAVY=$((2 * k)) LIGHT=$((2 * k))"
  modes=${MODES:-shared separate users union}
  build_mode() {
    case $1 in
    shared) run_together "${specs_shared[@]}" ;;
    separate) run_together "${specs_separate[@]}" ;;
    users) run_together "${specs_users[@]}" ;;
    union) run_together "$spec_union" ;;
    esac
  }
  for mode in $modes; do
    build_mode "$mode"
    log "k=$k: $mode warmed"
  done
  for ((repeat = 1; repeat <= REPEATS; repeat++)); do
    for mode in $modes; do
      build_mode "$mode"
      read -r wall exits oom requeues <<<"$line"
      log "k=$k repeat $repeat $mode: ${wall} s, exits $exits, OOM kills $oom, kills by headroom $requeues"
      echo "$k,$mode,$repeat,$wall,$exits,$oom,$requeues" >>"$results"
    done
  done
done

python3 - "$results" "$CAP" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print(f"cap {sys.argv[2]}, {len(set(r['repeat'] for r in rows))} repeats, medians; every build warm")
print("| sessions | mode | wall s | × union | failed builds (all runs) | OOM kills (all runs) | kills by headroom (all runs) |")
print("|---:|---|---:|---:|---:|---:|---:|")
for k in sorted(set(int(r["k"]) for r in rows)):
    of = lambda mode: [r for r in rows if int(r["k"]) == k and r["mode"] == mode]
    union = statistics.median(float(r["wall_s"]) for r in of("union"))
    for mode in ("shared", "separate", "users", "union"):
        runs = of(mode)
        wall = statistics.median(float(r["wall_s"]) for r in runs)
        failed = sum(sum(1 for x in r["exits"].split("/") if x != "0") for r in runs)
        oom = sum(int(r["oom_kills"]) for r in runs if r["oom_kills"].isdigit())
        kills = sum(int(r["requeues"]) for r in runs)
        print(f"| {k} | {mode} | {wall:.1f} | {wall / union:.2f} | {failed} | {oom} | {kills} |")
PY
