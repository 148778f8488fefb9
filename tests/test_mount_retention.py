"""A mount whose change feed expires under it (retention removed events its follower had not
read yet) resynchronises: what it caches is checked against the current state, so another
process's change is still seen."""

from __future__ import annotations

import os
import time

from tests.mount_fixtures import mount, needs_fuse  # noqa: F401
from tests.test_mount_freshness import read, within

pytestmark = needs_fuse

# Another process changes a file and at once removes every ChangeEvent up to its change, usually
# before the mount's follower (polling every 200 ms) has read it.
CHANGE_THEN_EXPIRE = """
from nokvfs.schema.enums import RetainedFamily
namespace.put(root, 'wb', 'outputs/watched.txt', data)
shard = root.shard
start = b''
while True:
    outcome = shard.prune_retained(owner_epoch=root.owner_epoch, family=RetainedFamily.ChangeEvent,
                                   floor_version=shard.commit_version, start_key=start)
    if outcome.next_key is None:
        break
    start = outcome.next_key
"""


def test_an_expired_feed_resynchronises_the_mount(mount):
    path = mount.path("wb", "outputs", "watched.txt")
    with open(path, "w") as f:
        f.write("version 0")
    assert read(path) == b"version 0"  # cached by the kernel now
    for attempt in range(1, 11):
        body = b"v" * (20 + attempt)
        assert os.stat(path).st_size != len(body)  # the kernel holds the old attributes (10 s)
        mount.facade(CHANGE_THEN_EXPIRE, data=body)
        # Only an invalidation makes the kernel ask again within a second (stat, not open: an
        # open always checks the revision the path holds).
        within(lambda: os.stat(path).st_size == len(body), deadline=1.0, what="a change whose event expired")
        if "resynchronising the mount's caches" in mount.log():
            break
        time.sleep(0.3)  # the follower read the event before it went: try again
    else:
        raise AssertionError("the follower never met an expired feed in 10 attempts:\n" + mount.log()[-2000:])
    assert read(path) == body
    assert "Traceback" not in mount.log()
