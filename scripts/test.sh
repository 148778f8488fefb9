#!/usr/bin/env bash
# Installs what the tests need, lints, then runs the whole test suite. Exit status is pytest's,
# except that a lint failure fails too and "no tests collected" (pytest's 5) is a failure: a suite
# that ran nothing proved nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || { echo "test: set-up failed" >&2; exit 1; }
PYTHON=${PYTHON:-python3}
# The code passes its linter and formatter (configured in pyproject.toml) before the tests run;
# a lint failure fails the run, after the tests have run too.
lint=0
"$PYTHON" -m ruff check nokvfs tests scripts || lint=1
"$PYTHON" -m ruff format --check nokvfs tests scripts || lint=1
# One worker per CPU and one more (pytest-xdist; NOKVFS_TEST_WORKERS=0 runs in this process): each
# test has its own tmp_path, data directory, mount point and daemon, so tests do not share state.
# With one per CPU the CPUs were busy 77% of the run on a two-CPU machine (32 CPU minutes in 21):
# the rest is tests waiting (deadlines, fsyncs, daemons starting), which the extra worker fills.
# worksteal evens out the few long mount tests.
workers=${NOKVFS_TEST_WORKERS:-$(($(nproc) + 1))}
"$PYTHON" -m pytest -q -p no:cacheprovider --durations=10 -n "$workers" --dist worksteal "$@"
status=$?
if [ "$lint" -ne 0 ] && [ "$status" -eq 0 ]; then
    echo "test: ruff found problems (ruff check --fix / ruff format fix most)" >&2
    status=1
fi
if [ "$status" -eq 5 ]; then
    echo "test: pytest collected no tests" >&2
    exit 1
fi
exit "$status"
