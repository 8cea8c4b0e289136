#!/usr/bin/env bash
# bazel.sh: what headroom does for a Bazel build, measured side by side in one run.
#
# examples/template-heavy as a Bazel workspace (one cc_library per unit, alwayslink, as the
# Makefile compiles one object per unit), built by Debian's Bazel 4.2.3 (`bazel-bootstrap`,
# offline, with local stand-ins for rules_cc and rules_java) inside a fresh memory-limited
# cgroup: plain `bazel build --jobs N` against `headroom build -- bazel build --jobs N`,
# interleaved, REPEATS times. The Bazel server starts inside the cgroup (its memory counts
# against the cap, as it does on a real machine) from a fresh output root, and is shut down
# after each run. Records wall time, exit status and the cgroup's OOM kills.
# Then the cost of headroom on a fully cached build: with the outputs built, `bazel build`
# with nothing to do, plain against under headroom, CACHED_REPEATS times each, with the
# server running (no cap).
#
# Usage (as root or with a delegated cgroup):  bench/build/bazel.sh
# Environment (all optional):
#   CAP=2G                 the memory cap
#   JOBS=4                 Bazel's --jobs and --local_cpu_resources (as on a JOBS-core machine)
#   REPEATS=1              capped runs per command
#   CACHED_REPEATS=5       fully cached runs per command (the table shows medians)
#   MIX="4 700 4 100"      heavy units, their MiB, light units, their MiB
#   HEADROOM=path          headroom binary (default target/release/headroom)
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
CAP=${CAP:-2G}
JOBS=${JOBS:-4}
REPEATS=${REPEATS:-1}
CACHED_REPEATS=${CACHED_REPEATS:-5}
read -r heavy heavy_mib light light_mib <<<"${MIX:-4 700 4 100}"
HEADROOM=${HEADROOM:-target/release/headroom}
[[ "$HEADROOM" == /* ]] || HEADROOM="$repo_root/$HEADROOM"
platforms=/usr/share/bazel/platforms

script_name=bazel.sh
# shellcheck source=bench/build/cgroups.sh
source "$script_dir/cgroups.sh"
command -v bazel >/dev/null && [[ -d $platforms ]] ||
  skip "Debian's bazel is not installed (apt-get install bazel-bootstrap)"
[[ -x "$HEADROOM" ]] || die "no headroom at $HEADROOM (cargo build --release, or set HEADROOM)"
setup_cgroups
work_dir=$(mktemp -d)
trap cleanup EXIT
cap_bytes=$(size_to_bytes "$CAP")

# --- the workspace -------------------------------------------------------------
ws=$work_dir/ws
mkdir -p "$ws" "$work_dir/rules_cc/cc" "$work_dir/rules_java/java"
cp "$repo_root"/examples/template-heavy/{unit.cpp,heavy.hpp,main.cpp} "$ws/"
echo 'workspace(name = "template_heavy")' >"$ws/WORKSPACE"
flags='"-std=c++17", "-O2", "--param", "ggc-min-expand=100", "--param", "ggc-min-heapsize=131072"'
{
  deps=()
  unit() { # kind, number, MiB
    echo "cc_library(name = \"$1-$2\", srcs = [\"unit.cpp\"], hdrs = [\"heavy.hpp\"], alwayslink = True,"
    echo "    copts = [$flags, \"-DUNIT_NAME=$1-$2\", \"-DTARGET_MIB=$3\"])"
    deps+=("\":$1-$2\"")
  }
  for n in $(seq 1 "$heavy"); do unit heavy "$n" "$heavy_mib"; done
  for n in $(seq 1 "$light"); do unit light "$n" "$light_mib"; done
  echo "cc_binary(name = \"template-heavy\", srcs = [\"main.cpp\", \"heavy.hpp\"], copts = [$flags],"
  echo "    deps = [$(IFS=,; echo "${deps[*]}")])"
} >"$ws/BUILD"
for repo in rules_cc:cc rules_java:java; do
  name=${repo%:*} package=${repo#*:}
  echo "workspace(name = \"$name\")" >"$work_dir/$name/WORKSPACE"
  : >"$work_dir/$name/BUILD"
  : >"$work_dir/$name/$package/BUILD"
done
for rule in cc_binary cc_import cc_library cc_proto_library cc_test cc_toolchain cc_toolchain_suite objc_library; do
  echo "$rule = native.$rule"
done >"$work_dir/rules_cc/cc/defs.bzl"
for rule in java_binary java_import java_library java_proto_library java_runtime java_test java_toolchain; do
  echo "$rule = native.$rule"
done >"$work_dir/rules_java/java/defs.bzl"

root=""
bazel_() { bazel --output_user_root="$root" --max_idle_secs=600 "$@"; }
# --local_cpu_resources: Bazel runs at most one action per core it counts, so on this 2-core
# machine it would run 2 whatever --jobs says; JOBS actions at once is a JOBS-core machine.
build_args=(build --jobs "$JOBS" --local_cpu_resources="$JOBS"
  --override_repository=rules_cc="$work_dir/rules_cc"
  --override_repository=rules_java="$work_dir/rules_java"
  --override_repository=platforms="$platforms" //:template-heavy)

# --- capped builds -------------------------------------------------------------
# Prints "wall exit" for one build ($1: plain or headroom) in the fresh cgroup $cgroup.
capped_run() {
  root=$work_dir/root-$1
  rm -rf "$root"
  (
    echo $BASHPID >"$cgroup/cgroup.procs"
    cd "$ws"
    bazel_ info >/dev/null 2>&1 # the server starts here, inside the cap
    start=$(date +%s.%N)
    status=0
    if [[ $1 == headroom ]]; then
      "$HEADROOM" build -- bazel --output_user_root="$root" --max_idle_secs=600 "${build_args[@]}" \
        >"$work_dir/$1.log" 2>&1 || status=$?
    else
      bazel_ "${build_args[@]}" >"$work_dir/$1.log" 2>&1 || status=$?
    fi
    end=$(date +%s.%N)
    bazel_ shutdown >/dev/null 2>&1 || true
    echo "$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.1f", e - s }') $status"
  )
}

echo "| cap | command | wall s | exit | OOM kills |"
echo "|---|---|---:|---:|---:|"
for _ in $(seq 1 "$REPEATS"); do
  for mode in plain headroom; do
    make_cgroup "$cap_bytes"
    read -r wall status < <(capped_run "$mode")
    kills=$(cgroup_oom_kills "$cgroup")
    label="bazel build --jobs $JOBS"
    [[ $mode == headroom ]] && label="headroom build -- $label"
    echo "| $CAP | \`$label\` | $wall | $status | $kills |"
    grep '^headroom: [0-9]* jobs' "$work_dir/$mode.log" >&2 || true
  done
done

# --- the fully cached build ----------------------------------------------------
# A governed build's action keys differ from a plain one's (headroom's --action_env), so
# each mode first builds its own outputs, then runs with nothing to do CACHED_REPEATS times
# in a row: plain first, then governed.
root=$work_dir/root-cached
cd "$ws"
seconds() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); awk -v s="$s" -v e="$e" 'BEGIN { printf "%.3f\n", e - s }'; }
governed_build() { "$HEADROOM" build -- bazel --output_user_root="$root" --max_idle_secs=600 "${build_args[@]}"; }
plain=() governed=()
bazel_ "${build_args[@]}" >/dev/null 2>&1
for _ in $(seq 1 "$CACHED_REPEATS"); do plain+=("$(seconds bazel_ "${build_args[@]}")"); done
governed_build >/dev/null 2>&1
for _ in $(seq 1 "$CACHED_REPEATS"); do governed+=("$(seconds governed_build)"); done
bazel_ shutdown >/dev/null 2>&1 || true
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
mp=$(median "${plain[@]}") mg=$(median "${governed[@]}")
echo
echo "| fully cached build (median of $CACHED_REPEATS) | seconds |"
echo "|---|---:|"
echo "| \`bazel build\` | $mp |"
echo "| \`headroom build -- bazel build\` | $mg |"
echo "| ratio | $(awk -v p="$mp" -v g="$mg" 'BEGIN { printf "%.2f", g / p }') |"
echo "plain runs: ${plain[*]}; headroom runs: ${governed[*]}" >&2
