#!/usr/bin/env bash
# Records real builds with `headroom build` and imports them into traces/recorded/:
#   zstd-sys         zstd-sys from crates.io (zstd's C sources through cc-rs), a minute at -j2
#   rocksdb          librocksdb-sys from crates.io (RocksDB's C++ sources through cc-rs), an hour
#   template-heavy   `make check` of the bundled examples/template-heavy project, a minute at -j2
#   torch-ext        PyG's torch-scatter/-sparse/-cluster CPU extensions against a PyTorch
#                    wheel (bench/sim/torch-ext), 1.3-2.4 GiB per unit, 12 minutes at -j2
# Usage: bench/sim/record.sh [JOBS [NAME...]]   (default 2 and all; run on an otherwise quiet
# machine). HEADROOM=path/to/headroom uses that build instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
jobs=${1:-2}
shift || true
for name in "$@"; do
    case $name in
    zstd-sys | rocksdb | torch-ext | template-heavy) ;;
    *) echo "record.sh: no recording named $name" >&2 && exit 2 ;;
    esac
done
only=" $* "
if [ -n "${HEADROOM:-}" ]; then
    headroom=$HEADROOM
else
    cargo build -p headroom
    headroom=$repo/target/debug/headroom
fi
work=$(mktemp -d)
export HEADROOM_STATE_DIR=$work/state
mkdir -p traces/recorded

# bindgen needs a libclang.so; Debian ships it as libclang-NN.so.1 only.
if [ -z "${LIBCLANG_PATH:-}" ]; then
    libclang=$(ls /usr/lib/llvm-*/lib/libclang-*.so.1 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$libclang" ]; then
        mkdir -p "$work/libclang"
        ln -s "$libclang" "$work/libclang/libclang.so"
        export LIBCLANG_PATH=$work/libclang
    fi
fi

# record_crate NAME DEPENDENCY-LINE: builds a one-dependency crate under headroom build.
record_crate() {
    local name=$1 dependency=$2
    mkdir -p "$work/$name/src"
    printf '[package]\nname = "%s-trace"\nversion = "0.1.0"\nedition = "2021"\n[dependencies]\n%s\n' \
        "$name" "$dependency" > "$work/$name/Cargo.toml"
    echo 'fn main() {}' > "$work/$name/src/main.rs"
    (cd "$work/$name" && "$headroom" build --jobs "$jobs" --report "$work/$name.json" -- cargo build -j "$jobs")
    "$headroom" sim import "$work/$name.json" --out "traces/recorded/$name.json" --jobs-flag "$jobs"
}

# record_torch_ext: the torch/extension.h units PyTorch users build. make -j64 offers every
# compile at once, so the governor (not make) picks which run and the import sees the real
# parallelism; the trace's jobs_flag is then the governor's slots.
record_torch_ext() {
    local cache=${TORCH_EXT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/headroom-bench/torch-ext}
    # Downloads (540 MB once) and unpacking stay outside the recorded wall time.
    bench/sim/torch-ext/fetch.sh "$cache"
    # Paths go through the environment so the recorded command holds none of this machine's.
    (cd bench/sim/torch-ext &&
        SRC=$cache/src TORCH=$cache/torch BUILD=$work/torch-ext \
            "$headroom" build --jobs "$jobs" --report "$work/torch-ext.json" -- make -j 64 &&
        SRC=$cache/src TORCH=$cache/torch BUILD=$work/torch-ext make check)
    "$headroom" sim import "$work/torch-ext.json" --out traces/recorded/torch-ext.json \
        --jobs-flag "$jobs" --name torch-ext
}

# wanted NAME: whether the command line asked for NAME (or for no name at all).
wanted() {
    [ "$only" = "  " ] || [[ $only == *" $1 "* ]]
}

wanted zstd-sys && record_crate zstd-sys 'zstd-sys = "2"'
wanted rocksdb && record_crate rocksdb 'librocksdb-sys = { version = "0.17", default-features = false }'
wanted torch-ext && record_torch_ext

if wanted template-heavy; then
    cp -r examples/template-heavy "$work/template-heavy"
    # A checkout that built the example holds its objects: record a build from none.
    make -s -C "$work/template-heavy" clean
    (cd "$work/template-heavy" &&
        "$headroom" build --jobs "$jobs" --report "$work/template.json" -- make -j "$jobs" check)
    "$headroom" sim import "$work/template.json" --out traces/recorded/template-heavy.json --jobs-flag "$jobs"
fi
rm -rf "$work"
