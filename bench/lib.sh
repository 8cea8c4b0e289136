# Sourced by bench scripts (`source "$(dirname "$0")/../lib.sh"`): the steps several of them
# take the same way, so that they take them alike.

# output_dir USAGE ARGS...: sets `out` to the absolute path of the only argument, a directory
# it creates; with any other number of arguments prints `usage: USAGE` and exits 2.
output_dir() {
    local usage=$1
    shift
    [ $# -eq 1 ] || { echo "usage: $usage" >&2; exit 2; }
    mkdir -p "$1"
    out=$(cd "$1" && pwd)
}

# release_headroom: sets `headroom` to $HEADROOM when it is set, else builds the release binary
# and names it. Run from the repository root.
release_headroom() {
    headroom=${HEADROOM:-}
    if [ -z "$headroom" ]; then
        cargo build --release -p headroom
        headroom=target/release/headroom
    fi
}
