#!/usr/bin/env bash
# Downloads what the Makefile next to this script builds, checks each file against the
# sha256 that PyPI lists for it, and unpacks it into CACHE:
#   CACHE/src/torch_scatter-2.1.2/ ...   the sdists (SRC= for the Makefile)
#   CACHE/torch/include, CACHE/torch/lib the wheel's headers and the libraries a
#                                        CppExtension links (TORCH= for the Makefile)
# The torch wheel is 540 MB; a copy already in CACHE/dl with the right hash is used as is.
# Usage: bench/sim/torch-ext/fetch.sh [CACHE]   (default ~/.cache/headroom-bench/torch-ext)
set -euo pipefail
source "$(dirname "$0")/../../lib.sh"
cache=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/headroom-bench/torch-ext}
mkdir -p "$cache/dl" "$cache/src"

# Project, file and sha256 as PyPI lists them. torch-scatter, -sparse and -cluster ship only
# sdists whose setup.py imports torch, so `pip download` cannot fetch them: the files come
# from the package index pip is configured with (PIP_INDEX_URL, pip's config, else PyPI).
files=(
    "torch-scatter torch_scatter-2.1.2.tar.gz 69b3aa435f2424ac6a1bfb6ff702da6eb73b33ca0db38fb26989c74159258e47"
    "torch-sparse torch_sparse-0.6.18.tar.gz 2f14c510a6e93f404c6ea357210615b3c15a71731f9dbd86f25434e34fb5a741"
    "torch-cluster torch_cluster-1.6.3.tar.gz 78d5a930a5bbd0d8788df8c6d66addd68d6dd292fe3edb401e3dacba26308152"
    "torch torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl 48c2d861134c0b5697c7602cb5ffa68f62a2989fdcd1717e593356f67996ca1e"
)
for entry in "${files[@]}"; do
    read -r project name sha <<<"$entry"
    file=$cache/dl/$name
    pypi_download "$project" "$name" "$sha" "$cache/dl"
    case $file in
    *.tar.gz)
        dir=$cache/src/$(basename "$file" .tar.gz)
        [ -d "$dir" ] || tar -xzf "$file" -C "$cache/src"
        ;;
    *.whl)
        # Only the headers and the libraries a CppExtension links: the CUDA libraries alone
        # would add 500 MB. The marker makes an interrupted unzip redo itself.
        if [ ! -f "$cache/torch/.unpacked" ]; then
            rm -rf "$cache/torch" "$cache/wheel"
            unzip -q "$file" 'torch/include/*' 'torch/lib/libc10.so' 'torch/lib/libtorch.so' \
                'torch/lib/libtorch_cpu.so' 'torch/lib/libtorch_python.so' -d "$cache/wheel"
            mv "$cache/wheel/torch" "$cache/torch"
            rmdir "$cache/wheel"
            touch "$cache/torch/.unpacked"
        fi
        ;;
    esac
done
echo "SRC=$cache/src TORCH=$cache/torch"
