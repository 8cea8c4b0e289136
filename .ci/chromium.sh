#!/usr/bin/env bash
# Installs headless Chromium (Debian 12's `chromium` package), which the HTML page test
# (crates/headroom/tests/html_pages.rs) renders the build, run and sim pages with: a
# screenshot that must not be blank, and the DOM after the pages' inline script has run.
#
# npm's puppeteer and playwright download their browsers from outside the package
# registries, which CI cannot reach; Debian's package needs nothing else. Run as root (CI's
# machine), or with Chromium already installed, where it does nothing. The test skips, saying
# why, where `chromium` is missing.
set -euo pipefail
start=$SECONDS
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
echo "chromium.sh: $(chromium --version 2>/dev/null || echo 'chromium --version failed') ($((SECONDS - start)) s)"
