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

# pypi_download PROJECT FILE SHA256 DIR: puts FILE of PROJECT's release files into DIR,
# checked against SHA256, unless a copy with that hash is there already. The file comes from
# the package index pip is configured with (PIP_INDEX_URL, pip's config, else PyPI), by its
# simple page, since sdists whose setup.py imports torch cannot go through `pip download`.
# Downloaded beside the target first, so an interrupted download never passes as done.
pypi_download() {
    local project=$1 name=$2 sha=$3 dir=$4 index url
    if [ -f "$dir/$name" ] && echo "$sha  $dir/$name" | sha256sum --check --status; then
        return
    fi
    index=${PIP_INDEX_URL:-$(pip config get global.index-url 2>/dev/null ||
        python3 -c 'from pip._internal.models.index import PyPI; print(PyPI.simple_url)')}
    url=$(python3 - "${index%/}/$project/" "$name" <<'PY'
import re, sys, urllib.parse, urllib.request
page, name = sys.argv[1], sys.argv[2]
html = urllib.request.urlopen(page).read().decode()
for href in re.findall(r'href="([^"]+)"', html):
    url = urllib.parse.urljoin(page, href.split("#")[0])
    if url.rsplit("/", 1)[-1] == name:
        print(url)
        sys.exit(0)
sys.exit(f"{name} is not listed on {page}")
PY
)
    mkdir -p "$dir"
    curl --fail --location --retry 3 --silent --show-error --output "$dir/$name.part" "$url"
    if ! echo "$sha  $dir/$name.part" | sha256sum --check --status; then
        rm -f "$dir/$name.part"
        echo "$name does not have sha256 $sha" >&2
        exit 1
    fi
    mv "$dir/$name.part" "$dir/$name"
}

# governor_of BUILD: the process id of the governor that `headroom build` process BUILD
# started (a session of its own state directory runs a private one), or nothing before it is
# up.
governor_of() {
    pgrep -P "$1" -f ' __governor$' | head -1 || true
}
