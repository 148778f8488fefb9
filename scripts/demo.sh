#!/usr/bin/env bash
# The main job on the embedded default (a local shard and a local object store): create a data
# directory, publish a few artifacts, mount the Visible workbenches with FUSE and show them with
# ls and cat; write a file through the mount and read it back through the CLI; unmount.
# Everything lives in a temporary directory that is removed at the end (keep it with KEEP=1).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
nokvfs() { "$PYTHON" -m nokvfs.cli.main "$@"; }

WORK=$(mktemp -d /tmp/nokvfs-demo.XXXXXX)
export NOKVFS_DATA_DIR="$WORK/data"
MOUNTPOINT="$WORK/mnt"
cleanup() {
    if mountpoint -q "$MOUNTPOINT" 2>/dev/null; then nokvfs umount "$MOUNTPOINT" || fusermount3 -u "$MOUNTPOINT" || umount -l "$MOUNTPOINT"; fi
    [ "${KEEP:-0}" = 1 ] && echo "kept $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT
if [ -t 1 ]; then step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }; else step() { printf '\n$ %s\n' "$*"; }; fi

step "nokvfs init"; nokvfs init
step "nokvfs workbench create demo"; nokvfs workbench create demo
step "publish artifacts"
printf 'hello from nokvfs\n' | nokvfs put demo:outputs/hello.txt
nokvfs put demo:input/README.md README.md
seq 1 1000 | nokvfs put demo:outputs/numbers.txt --index kind=table
mkdir -p "$MOUNTPOINT"
step "nokvfs mount $NOKVFS_DATA_DIR $MOUNTPOINT"; nokvfs mount "$NOKVFS_DATA_DIR" "$MOUNTPOINT"
step "ls $MOUNTPOINT"; ls "$MOUNTPOINT"
step "ls $MOUNTPOINT/demo"; ls "$MOUNTPOINT/demo"
step "ls -l $MOUNTPOINT/demo/outputs"; ls -l "$MOUNTPOINT/demo/outputs"
step "cat $MOUNTPOINT/demo/outputs/hello.txt"; cat "$MOUNTPOINT/demo/outputs/hello.txt"
step "tail -n 3 $MOUNTPOINT/demo/outputs/numbers.txt"; tail -n 3 "$MOUNTPOINT/demo/outputs/numbers.txt"
step "echo 'written through the mount' > $MOUNTPOINT/demo/logs/run.log"
echo "written through the mount" > "$MOUNTPOINT/demo/logs/run.log"
step "nokvfs get demo:logs/run.log   # published as a new revision on close"; nokvfs get demo:logs/run.log
step "nokvfs ls -l -R demo"; nokvfs ls -l -R demo
step "nokvfs status $MOUNTPOINT   # what the running mount did"; nokvfs status "$MOUNTPOINT"
step "nokvfs umount $MOUNTPOINT"; nokvfs umount "$MOUNTPOINT"
step "nokvfs fsck"; nokvfs fsck
