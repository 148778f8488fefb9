"""An object store whose calls are timed: what a mount's `status` and metrics say about its store.

Every call goes to the inner store unchanged; each kind of call (get, put, head, ...) has its
own Meter (nokvfs.meters), so latency and failures by kind are visible per operation. A call the
inner store has that the interface does not (a backend's own batching, say) is passed through.
"""

from __future__ import annotations

from nokvfs.meters import Meters
from nokvfs.objects.store import ObjectStore, stage_put


class MeteredStore(ObjectStore):
    def __init__(self, inner: ObjectStore, meters: Meters):
        self.inner = inner
        self.meters = meters
        self.url = inner.url

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put(self, key, data, **kwargs):
        with self.meters["put"].timing():
            return self.inner.put(key, data, **kwargs)

    def stage_put(self, data, *, key_hint=None, content_sha256=None):
        """The inner store's staged put (nokvfs.objects.store.stage_put), or None: staging is
        metered as `stage_put`, the commit that links the bytes at their key as `put`."""
        with self.meters["stage_put"].timing():
            staged = stage_put(self.inner, data, key_hint, content_sha256)
        return None if staged is None else _MeteredStaged(staged, self.meters["put"])

    def put_file(self, key, path, **kwargs):
        with self.meters["put_file"].timing():
            return self.inner.put_file(key, path, **kwargs)

    def put_many(self, items, **kwargs):
        # The inner store's own batching (one sync per directory locally, parallel PUTs on S3),
        # timed as one call.
        with self.meters["put_many"].timing():
            return self.inner.put_many(items, **kwargs)

    def get(self, key, start=0, length=None):
        with self.meters["get"].timing():
            return self.inner.get(key, start, length)

    def get_vouched(self, key, length):
        with self.meters["get"].timing():
            return self.inner.get_vouched(key, length)

    def head(self, key):
        with self.meters["head"].timing():
            return self.inner.head(key)

    def delete(self, key):
        with self.meters["delete"].timing():
            return self.inner.delete(key)

    def delete_many(self, keys):
        # One call, timed as one (its per-key failures are answers, not failures of the call).
        with self.meters["delete_many"].timing():
            return self.inner.delete_many(keys)

    def list(self, prefix=""):
        return self.inner.list(prefix)

    def create_multipart(self, key, **kwargs):
        with self.meters["create_multipart"].timing():
            return self.inner.create_multipart(key, **kwargs)

    def upload_part(self, key, upload_id, part_number, data):
        with self.meters["upload_part"].timing():
            return self.inner.upload_part(key, upload_id, part_number, data)

    def complete_multipart(self, key, upload_id, parts, **kwargs):
        with self.meters["complete_multipart"].timing():
            return self.inner.complete_multipart(key, upload_id, parts, **kwargs)

    def abort_multipart(self, key, upload_id):
        with self.meters["abort_multipart"].timing():
            return self.inner.abort_multipart(key, upload_id)

    def multipart_uploads(self, key):
        return self.inner.multipart_uploads(key)

    def statfs(self):
        return self.inner.statfs()

    def remove_stale_temp_files(self, *, everywhere: bool = False) -> int:
        return self.inner.remove_stale_temp_files(everywhere=everywhere)

    def close(self) -> None:
        self.inner.close()


class _MeteredStaged:
    def __init__(self, staged, meter):
        self._staged, self._meter = staged, meter

    def commit(self, key, **kwargs):
        with self._meter.timing():
            return self._staged.commit(key, **kwargs)

    def wait(self):
        self._staged.wait()

    def discard(self):
        self._staged.discard()
