#!/usr/bin/env bash
# caps.sh: why this script exists
#
# `headroom build` promises zero OOM kills and a wall time close to the fastest static
# `make -jN` that survives. This script measures exactly that, side by side in one run:
# for every memory cap it builds examples/template-heavy inside a fresh memory-limited
# cgroup (v1 or v2) with static `make -j1`, `-j2`, `-jN` (N = nproc) and `-j8`, and
# with `headroom build -- make`, interleaved, REPEATS times. Each run records wall time,
# exit status, OOM kills and the cgroup's peak memory. It prints a Markdown table of
# medians and writes the raw runs as CSV.
#
# Usage (from anywhere, as root or with a delegated cgroup):
#   bench/build/caps.sh                 # caps 1.5G 3G 6G, default example mix, 3 repeats
#   QUICK=1 bench/build/caps.sh         # tiny mix, caps 500M 1G, one repeat (~1 min)
#   PROJECT=torch-cpp CAPS="3G 6G" bench/build/caps.sh
#                                       # examples/torch-cpp: a PyTorch C++ API project,
#                                       # configured with CMake before any build runs, built
#                                       # with `ninja -jJ` and `headroom build -- ninja`
#   SHARED=1 CAPS=1.5G JOBS="1 2" bench/build/caps.sh
#                                       # adds a row for a first build with shared history:
#                                       # before each such run, the peaks headroom's own row
#                                       # measured so far are pushed to a directory store,
#                                       # and a second copy of the project, elsewhere, with
#                                       # an empty state directory, pulls them and builds
#   PROJECT=flash-attn CAPS=6.5G JOBS="1 2" REPEATS=2 bench/build/caps.sh
#                                       # flash-attention's PyPI sdist: flash_api.cpp and four
#                                       # sm_80 forward kernels (bench/build/flash_attn_subset_setup.py),
#                                       # built by `MAX_JOBS=J pip install --no-build-isolation .`
#                                       # and `headroom build -- pip install --no-build-isolation .`
#
# Environment (all optional):
#   CAPS="1.5G 3G 6G"     memory caps (binary units: K, M, G, T)
#   REPEATS=3             runs per cap and command; the table shows medians
#   JOBS="1 2 N 8"        static -j values; N means nproc; duplicates are dropped
#   MAKE_VARS="..."       example mix, e.g. "HEAVY=6 HEAVY_MIB=1024 LIGHT=12 LIGHT_MIB=150"
#   HEADROOM=path         headroom binary (default target/release/headroom); rows are
#                         skipped with a note when it is not there
#   HEADROOM_ARGS="..."   extra arguments for `headroom build`, before `--`
#   SHARED=1              also the first build with shared history (template-heavy, torch-cpp)
#   COLD=1                every headroom run is a first build: its history is emptied before
#                         each run (default: the first run is cold, later ones are warm)
#   RESULTS=prefix        output prefix (default bench/build/results/caps, or .../quick);
#                         writes PREFIX.csv and PREFIX.md
#   REPORT_ONLY=1         only re-render PREFIX.md from PREFIX.csv (e.g. after Ctrl-C)
#   PROJECT=template-heavy  or torch-cpp (needs `bash .ci/cuda.sh`: torch's CMake package
#                         looks for the CUDA toolkit even for CPU code), or flash-attn (the
#                         same, and downloads the sdist once into ~/.cache/headroom-bench);
#                         TORCH_ENV moves where that script installed them (default
#                         ~/.cache/headroom-ci)
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$script_dir/../.." && pwd)
PROJECT=${PROJECT:-template-heavy}
example_dir="$repo_root/examples/template-heavy"
case "$PROJECT" in
template-heavy) tool=make ;;
torch-cpp) tool=ninja ;;
flash-attn) tool=pip ;;
*) echo "caps.sh: PROJECT must be template-heavy, torch-cpp or flash-attn, got '$PROJECT'" >&2; exit 2 ;;
esac

if [[ "${QUICK:-0}" == 1 ]]; then
  CAPS=${CAPS:-500M 1G}
  REPEATS=${REPEATS:-1}
  MAKE_VARS=${MAKE_VARS:-HEAVY=2 HEAVY_MIB=300 LIGHT=4 LIGHT_MIB=100}
  RESULTS=${RESULTS:-$script_dir/results/quick}
else
  CAPS=${CAPS:-1.5G 3G 6G}
  REPEATS=${REPEATS:-3}
  MAKE_VARS=${MAKE_VARS:-}
  default_results=$script_dir/results/caps
  [[ $PROJECT != template-heavy ]] && default_results=$script_dir/results/$PROJECT
  RESULTS=${RESULTS:-$default_results}
fi
JOBS=${JOBS:-1 2 N 8}
HEADROOM=${HEADROOM:-target/release/headroom}
HEADROOM_ARGS=${HEADROOM_ARGS:-}
SHARED=${SHARED:-0}
COLD=${COLD:-0}
[[ $COLD == 0 || $COLD == 1 ]] || die "COLD must be 0 or 1, got '$COLD'"
[[ $SHARED == 0 || $PROJECT != flash-attn ]] || die "SHARED=1 is for PROJECT=template-heavy or torch-cpp"
headroom_shown=$HEADROOM
[[ "$HEADROOM" == /* ]] || HEADROOM="$repo_root/$HEADROOM"

script_name=caps.sh
# shellcheck source=bench/build/cgroups.sh
source "$script_dir/cgroups.sh"
# --- report --------------------------------------------------------------------
# Prints the Markdown table of medians for the CSV in $1.
table() {
  awk -F, '
    function median(list,    n, values, i, j, swap) {
      n = split(list, values, " ")
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
        if (values[j] + 0 < values[i] + 0) { swap = values[i]; values[i] = values[j]; values[j] = swap }
      return n % 2 ? values[(n + 1) / 2] : (values[n / 2] + values[n / 2 + 1]) / 2
    }
    NR == 1 { next }
    {
      key = $2 SUBSEP $4
      if (!(key in walls)) { order[++rows] = key; cap_of[rows] = $2; label_of[rows] = $4 }
      walls[key] = walls[key] " " $5
      exits[key] = exits[key] == "" ? $6 : exits[key] "," $6
      if ($6 != 0) failed[key] = 1
      kills[key] += ($7 == "n/a" ? 0 : $7)
      if ($8 != "n/a") peaks[key] = peaks[key] " " $8
    }
    END {
      print "| cap | command | median wall s | OOM kills (all runs) | exit | median peak MiB | headroom / fastest static ok |"
      print "|---|---|---:|---:|---|---:|---:|"
      for (r = 1; r <= rows; r++) {
        key = order[r]; cap = cap_of[r]; label = label_of[r]
        ratio = ""
        if (label ~ /^headroom/) {
          best = ""
          for (s = 1; s <= rows; s++) {
            other = order[s]
            if (cap_of[s] != cap || label_of[s] !~ /^(make -j|ninja -j|MAX_JOBS=)/) continue
            if (kills[other] > 0 || (other in failed)) continue
            if (best == "" || median(walls[other]) < best) { best = median(walls[other]); best_label = label_of[s] }
          }
          ratio = best == "" ? "n/a (every static -j failed)" : sprintf("%.2f (vs %s)", median(walls[key]) / best, best_label)
        }
        peak = peaks[key] == "" ? "n/a" : sprintf("%.0f", median(peaks[key]) / 1048576)
        printf "| %s | %s | %.1f | %d | %s | %s | %s |\n", cap, label, median(walls[key]), kills[key], exits[key], peak, ratio
      }
    }' "$1"
}

# Writes $RESULTS.md from $RESULTS.csv and prints it; $1 describes how the runs were made.
write_report() {
  local runs=$1 csv="$RESULTS.csv" md="$RESULTS.md"
  [[ -f "$csv" ]] || die "no results at $csv: run the benchmark first, or set RESULTS to its prefix"
  {
    echo "Machine: $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(g++ --version | head -n 1)."
    echo "$runs"
    echo
    table "$csv"
  } >"$md"
  cat "$md"
  log "wrote $md"
}

if [[ "${REPORT_ONLY:-0}" == 1 ]]; then
  write_report "Mix: ${MAKE_VARS:-Makefile defaults}; re-rendered with REPORT_ONLY=1 from the runs in $(basename "$RESULTS").csv."
  exit 0
fi

# --- benchmark -----------------------------------------------------------------
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || die "REPEATS must be a positive integer, got '$REPEATS'"
for cap in $CAPS; do size_to_bytes "$cap" >/dev/null; done
[[ -f "$example_dir/Makefile" ]] || die "no example at $example_dir: run this script from a headroom checkout"
command -v make >/dev/null || skip "make is not installed (apt-get install make)"
command -v g++ >/dev/null || skip "g++ is not installed (apt-get install g++)"
if [[ $PROJECT != template-heavy ]]; then
  torch_env=${TORCH_ENV:-$HOME/.cache/headroom-ci}
  [[ -x "$torch_env/venv/bin/python" && -x "$torch_env/cuda-home/bin/nvcc" ]] ||
    skip "no torch and CUDA toolkit in $torch_env (run 'bash .ci/cuda.sh')"
fi
if [[ $PROJECT == torch-cpp ]]; then
  command -v cmake >/dev/null && command -v ninja >/dev/null ||
    skip "cmake and ninja are not installed (apt-get install cmake ninja-build)"
fi

# --- cgroups -----------------------------------------------------------------
setup_cgroups
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- what to run ---------------------------------------------------------------
nproc=$(nproc)
static_jobs=()
for jobs in $JOBS; do
  [[ "$jobs" == N ]] && jobs=$nproc
  [[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "JOBS must list positive integers or N, got '$jobs'"
  [[ " ${static_jobs[*]} " == *" $jobs "* ]] || static_jobs+=("$jobs")
done
labels=()
for jobs in "${static_jobs[@]}"; do
  if [[ $tool == pip ]]; then labels+=("MAX_JOBS=$jobs pip install"); else labels+=("$tool -j$jobs"); fi
done
headroom_note=""
if [[ -x "$HEADROOM" ]]; then
  if [[ $COLD == 1 ]]; then labels+=("headroom build -- $tool (cold)"); else labels+=("headroom build -- $tool"); fi
  [[ $SHARED == 1 ]] && labels+=("headroom build -- $tool (first build from shared history)")
else
  headroom_note="headroom rows skipped: no executable at $headroom_shown (build it with 'cargo build --release -p headroom' or set HEADROOM)"
  log "$headroom_note"
fi

# Prints the argv of the build for a label, one word per line.
build_argv() {
  local label=$1 var
  local -a vars=()
  for var in $MAKE_VARS; do vars+=("$var"); done
  local -a build=(make check "${vars[@]}")
  [[ $tool == ninja ]] && build=(ninja -C build)
  [[ $tool == pip ]] && build=("$torch_env/venv/bin/python" -m pip install --no-build-isolation --no-deps --no-index .)
  case "$label" in
  "$tool -j"*) printf '%s\n' "${build[0]}" "-j${label#"$tool" -j}" "${build[@]:1}" ;;
  MAX_JOBS=*) printf '%s\n' env "${label%% *}" "${build[@]}" ;;
  headroom*)
    printf '%s\n' "$HEADROOM" build
    for var in $HEADROOM_ARGS; do printf '%s\n' "$var"; done
    printf '%s\n' -- "${build[@]}"
    ;;
  esac
}

# The builds run in a scratch copy, so the source tree stays clean. With SHARED=1, a second
# copy elsewhere is the "new machine" that builds with shared history.
work_dir=$(mktemp -d "${TMPDIR:-/tmp}/headroom-caps.XXXXXX")
other_dir=$work_dir/elsewhere/copy
mkdir -p "$other_dir"
for dir in "$work_dir" "$other_dir"; do
  cp "$example_dir"/Makefile "$example_dir"/*.hpp "$example_dir"/*.cpp "$dir"/
done
if [[ $PROJECT == flash-attn ]]; then
  # flash-attention's own sdist from PyPI, with a setup.py that builds a subset of it.
  # shellcheck source=bench/build/flash-attn-source.sh
  source "$script_dir/flash-attn-source.sh"
  unpack_flash_attn_subset "$work_dir"
  export CUDA_HOME="$torch_env/cuda-home"
fi
if [[ $PROJECT == torch-cpp ]]; then
  # Configured once, before and outside any build, as users do: CMake records the compiler
  # by absolute path.
  for dir in "$work_dir" "$other_dir"; do
    TORCH_CUDA_ARCH_LIST=8.0 cmake -S "$repo_root/examples/torch-cpp" -B "$dir/build" -G Ninja \
      -DCMAKE_PREFIX_PATH="$("$torch_env/venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null)" \
      -DCUDA_TOOLKIT_ROOT_DIR="$torch_env/cuda-home" -DCMAKE_CUDA_COMPILER="$torch_env/cuda-home/bin/nvcc" \
      -DCMAKE_CUDA_ARCHITECTURES=80 $MAKE_VARS >"$work_dir/configure.log" 2>&1 ||
      die "configuring examples/torch-cpp failed; see $work_dir/configure.log"
  done
fi
# headroom keeps its history with the scratch copy: the first headroom run of the benchmark
# is cold, later ones predict from what earlier ones measured, as a user's repeat builds do.
export HEADROOM_STATE_DIR="$work_dir/headroom-state"
# A make that calls this script must not hand its jobserver or flags to the builds.
unset MAKEFLAGS MFLAGS MAKELEVEL

mkdir -p "$(dirname "$RESULTS")"
csv="$RESULTS.csv"
echo "repeat,cap,cap_bytes,command,wall_s,exit,oom_kills,peak_bytes" >"$csv"

# The "new machine" of SHARED=1: an empty state directory that pulls what headroom's own row
# has measured so far, pushed to a directory store. Prints the state directory.
shared_state() {
  local store="file://$work_dir/store" state="$work_dir/new-machine-state"
  rm -rf "$state"
  (cd "$work_dir" && "$HEADROOM" history push --store "$store" --project bench) >&2 ||
    die "headroom history push failed"
  (cd "$other_dir" && HEADROOM_STATE_DIR=$state "$HEADROOM" history pull --store "$store" --project bench) >&2 ||
    die "headroom history pull failed"
  echo "$state"
}

# Runs one build in a fresh cgroup and appends a CSV row.
run_one() {
  local repeat=$1 cap=$2 label=$3 cap_bytes cgroup start end wall status oom peak
  local dir=$work_dir state=$HEADROOM_STATE_DIR
  local -a argv
  mapfile -t argv < <(build_argv "$label")
  cap_bytes=$(size_to_bytes "$cap")
  if [[ $label == *"shared history)" ]]; then
    dir=$other_dir
    state=$(shared_state)
  elif [[ $COLD == 1 && $label == headroom* ]]; then
    rm -rf "$state"
  fi
  case $tool in
  ninja) ninja -C "$dir/build" -t clean >/dev/null ;;
  pip) rm -rf "$dir/build" "$dir"/*.egg-info ;;
  *) make -C "$dir" clean >/dev/null ;;
  esac
  make_cgroup "$cap_bytes"
  start=$EPOCHREALTIME
  status=0
  # The child shell moves itself into the cgroup before exec, so only the build is limited.
  HEADROOM_STATE_DIR=$state bash -c 'echo $$ >"$1/cgroup.procs" && cd "$2" && shift 2 && exec "$@"' \
    caps-run "$cgroup" "$dir" "${argv[@]}" >"$work_dir/build.log" 2>&1 || status=$?
  end=$EPOCHREALTIME
  wall=$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }')
  oom=$(cgroup_oom_kills "$cgroup")
  peak=$(cgroup_peak_bytes "$cgroup")
  rmdir "$cgroup" || log "could not remove $cgroup; remove it by hand with rmdir"
  echo "$repeat,$cap,$cap_bytes,$label,$wall,$status,$oom,$peak" >>"$csv"
  log "repeat $repeat cap $cap: $label: ${wall} s, exit $status, OOM kills $oom, peak $peak bytes"
  if [[ $status != 0 && $oom == 0 ]]; then
    log "the build failed without an OOM kill; last lines of its log:"
    tail -n 5 "$work_dir/build.log" >&2
  fi
}

log "cgroup v$cgroup_version under $cgroup_parent; caps: $CAPS; repeats: $REPEATS; mix: ${MAKE_VARS:-Makefile defaults}"
# Interleaved: every repeat visits every cap and command, so drift in the machine's
# load spreads over all rows alike.
for ((repeat = 1; repeat <= REPEATS; repeat++)); do
  for cap in $CAPS; do
    for label in "${labels[@]}"; do
      run_one "$repeat" "$cap" "$label"
    done
  done
done

builds='`make -jJ check`'
[[ $tool == ninja ]] && builds='`ninja -C build -jJ` in a tree configured beforehand'
[[ $tool == pip ]] && builds='`pip install --no-build-isolation .` of the flash-attn 2.8.3 sdist (flash_api.cpp and four sm_80 forward kernels)'
runs="Project: $PROJECT; mix: ${MAKE_VARS:-defaults}; cgroup v$cgroup_version; builds: $builds; $REPEATS repeats, interleaved; $(date -u +%Y-%m-%d)."
[[ -n "$headroom_note" ]] && runs+=" Note: ${headroom_note%% (*}."
write_report "$runs"
log "raw runs: $csv"
