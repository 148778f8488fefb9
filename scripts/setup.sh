#!/usr/bin/env bash
# Installs everything nokvfs needs on a fresh Debian machine (run as root): the FUSE 3 runtime and
# headers that pyfuse3 builds against (and rsync and git, which the mount tests drive; systemd for the
# systemd-analyze and libseccomp the unit-file tests use), then nokvfs itself with its FUSE and
# test extras.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
for pkg in fuse3 libfuse3-dev pkg-config rsync git systemd; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e '.[fuse,test]'
# An editable install compiles nothing, and with PYTHONDONTWRITEBYTECODE set (as in some
# containers) no process caches its bytecode either: every `nokvfs` command and mount daemon then
# compiled nokvfs from source at start (0.2-0.3 s more for `nokvfs --help`). Compiled once here,
# each start reads the .pyc files (ignored by git), whatever that variable says.
"$PYTHON" -m compileall -q -j 0 nokvfs tests scripts >/dev/null
