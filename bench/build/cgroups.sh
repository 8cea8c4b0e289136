# cgroups.sh: sourced by the benchmarks that run builds in memory-limited cgroups (caps.sh,
# farm.sh), so they make, read and remove cgroups one way. It detects cgroup v1 or v2, makes
# children of this process's own memory cgroup (so it works inside containers and never
# touches cgroups it does not own), and reads their OOM kills and peaks. The caller sets
# script_name (for messages) and work_dir (removed by cleanup), and sets `trap cleanup EXIT`.

die() {
  echo "$script_name: $*" >&2
  exit 2
}
skip() {
  echo "$script_name: skipping: $*" >&2
  exit 0
}
log() { echo "$script_name: $*" >&2; }

# "1.5G" -> bytes. Binary units, as everywhere in headroom.
size_to_bytes() {
  awk -v size="$1" 'BEGIN {
    if (match(size, /^[0-9]+(\.[0-9]+)?[KkMmGgTt]?$/) == 0) exit 1
    unit = toupper(substr(size, length(size)))
    number = size + 0
    factor = 1
    if (unit == "K") factor = 1024
    if (unit == "M") factor = 1024 ^ 2
    if (unit == "G") factor = 1024 ^ 3
    if (unit == "T") factor = 1024 ^ 4
    printf "%.0f\n", number * factor
  }' || die "invalid size '$1': use a size like 500M, 1.5G or 6G"
}

cgroup_version=""
cgroup_parent=""
# Finds the memory cgroup to make children in, or skips the benchmark saying why.
setup_cgroups() {
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    cgroup_version=2
    own=$(awk -F: '$1 == "0" { print $3 }' /proc/self/cgroup)
    cgroup_parent="/sys/fs/cgroup${own%/}"
    if ! grep -qw memory "$cgroup_parent/cgroup.subtree_control" 2>/dev/null; then
      echo +memory >"$cgroup_parent/cgroup.subtree_control" 2>/dev/null ||
        skip "cannot enable the memory controller under $cgroup_parent (cgroup v2 allows it only in a cgroup without processes of its own: run this under 'systemd-run --scope -p Delegate=yes' or from a delegated cgroup)"
    fi
  else
    own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup)
    [[ -n "$own" && -d /sys/fs/cgroup/memory ]] ||
      skip "no cgroup v1 memory controller is mounted at /sys/fs/cgroup/memory and no cgroup v2 at /sys/fs/cgroup"
    cgroup_version=1
    cgroup_parent="/sys/fs/cgroup/memory${own%/}"
  fi
  [[ -w "$cgroup_parent" ]] || skip "cannot create cgroups under $cgroup_parent (run as root or from a delegated cgroup)"
}

made_cgroups=()
# On exit, also after Ctrl-C: end what is left of our builds, then remove our cgroups.
cleanup() {
  local cgroup pid
  for cgroup in "${made_cgroups[@]}"; do
    [[ -d "$cgroup" ]] || continue
    for _ in 1 2 3 4 5; do
      while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$cgroup/cgroup.procs"
      rmdir "$cgroup" 2>/dev/null && break
      sleep 0.2
    done
    [[ -d "$cgroup" ]] && log "could not remove $cgroup; remove it by hand with rmdir"
  done
  [[ -n "${work_dir:-}" ]] && rm -rf "$work_dir"
  return 0
}

# Makes a fresh cgroup limited to $1 bytes; its path is left in $cgroup.
make_cgroup() {
  local limit=$1
  cgroup="$cgroup_parent/headroom-bench-$$-${#made_cgroups[@]}"
  mkdir "$cgroup" || skip "cannot create the cgroup $cgroup"
  made_cgroups+=("$cgroup")
  if [[ $cgroup_version == 1 ]]; then
    echo "$limit" >"$cgroup/memory.limit_in_bytes"
    # Without this, a machine with swap would swap instead of OOM-killing.
    if [[ -f "$cgroup/memory.memsw.limit_in_bytes" ]]; then
      echo "$limit" >"$cgroup/memory.memsw.limit_in_bytes"
    fi
  else
    echo "$limit" >"$cgroup/memory.max"
    [[ -f "$cgroup/memory.swap.max" ]] && echo 0 >"$cgroup/memory.swap.max"
  fi
}

cgroup_oom_kills() {
  local file=$1/memory.oom_control
  [[ $cgroup_version == 2 ]] && file=$1/memory.events
  awk '$1 == "oom_kill" { print $2; found = 1 } END { if (!found) print "n/a" }' "$file"
}

cgroup_peak_bytes() {
  local file=$1/memory.max_usage_in_bytes
  [[ $cgroup_version == 2 ]] && file=$1/memory.peak
  if [[ -f "$file" ]]; then cat "$file"; else echo "n/a"; fi
}
