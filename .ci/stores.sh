#!/usr/bin/env bash
# Installs the servers that the shared kernel store tests talk to, on loopback:
#
#   redis-server    Debian's package
#   ENV/venv        a virtual environment with moto's S3 server (moto_server) and the WebDAV
#                   server wsgidav with cheroot
#
# ENV is $HEADROOM_STORES_ENV, by default ~/.cache/headroom-stores; pip's downloads are cached
# in ~/.cache/pip, so a second run installs nothing new. The tests find ENV the same way, and
# each one skips with its reason when its server is missing.
set -euo pipefail
env_dir="${HEADROOM_STORES_ENV:-$HOME/.cache/headroom-stores}"
venv="$env_dir/venv"

need_pkgs=()
command -v redis-server >/dev/null 2>&1 || need_pkgs+=(redis-server)
# Debian's python3 makes virtual environments only with python3-venv.
python3 -c 'import ensurepip' 2>/dev/null || need_pkgs+=(python3-venv)
if ((${#need_pkgs[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

if ! [ -x "$venv/bin/moto_server" ] || ! [ -x "$venv/bin/wsgidav" ] ||
   ! "$venv/bin/python" -c 'import cheroot' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "moto[server]==5.2.5" "wsgidav==4.4.0" "cheroot==11.1.2"
fi
echo "stores.sh: $(redis-server --version | cut -d' ' -f1-3), $("$venv/bin/pip" list 2>/dev/null | grep -iE '^(moto|wsgidav|cheroot) ' | tr -s ' ' | paste -sd, -)"
