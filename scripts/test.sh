#!/usr/bin/env bash
# Installs what the tests need, then runs the whole test suite. Exit status is pytest's, except
# that "no tests collected" (pytest's 5) is a failure: a suite that ran nothing proved nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || { echo "test: set-up failed" >&2; exit 1; }
PYTHON=${PYTHON:-python3}
"$PYTHON" -m pytest -q -p no:cacheprovider "$@"
status=$?
if [ "$status" -eq 5 ]; then
    echo "test: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
