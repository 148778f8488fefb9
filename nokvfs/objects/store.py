"""The one small interface every object store implements, and `open_store`.

Two backends sit behind it: `LocalStore` (a directory, the embedded default, and what the tests
use) and `S3Store` (any S3-compatible service through boto3). Callers never branch on the
backend; the rules below hold for both.

Keys. A key is a non-empty string of at most 1024 UTF-8 bytes made of ``/``-separated, non-empty
components; no component is ``.`` or ``..``, none starts with ``.nokv-`` (reserved for a store's
own files), and no character is a control character or a backslash. A bad key is InvalidInput.

ETags. An etag is an opaque string without quotes. It changes whenever the object's bytes are
replaced; `if_match` compares it exactly. It is not a content digest (S3 multipart etags are not):
content integrity is the SHA-256 digest URI checked by `nokvfs.objects.blocks`.

Metadata. User metadata is a small ``dict[str, str]``: keys ``[a-z0-9][a-z0-9-]*``, values
printable ASCII without leading or trailing blanks, at most 2 KiB in all (the S3 limits), so
both backends return exactly what was stored.

Errors. Absent objects are ObjectMissing for `get` and None for `head`; `delete` of an absent key
succeeds, and so does that key in `delete_many` (which answers per key). A conditional write
that loses is PreconditionFailed: `if_none_match` when the key exists, `if_match` when the key
is absent or its etag differs. A mutating request whose outcome is
unknown (sent, then a timeout or reset) is AmbiguousResult and is never guessed either way; the
caller's ledger keeps the key Quarantined until `head` reconciles it. No space is StoreFull, any
other failure StoreError naming the key or path.

Multipart. The publish pipeline records its intent to upload a key in parts in its StagedObject
ledger before `create_multipart`, and the upload id it returns before any part is sent; cleanup
aborts from the ledger. A crash between creating the upload and recording its id leaves only the
intent: `multipart_uploads(key)` then names the unfinished uploads to that one exact key (the
ledger's own key, which embeds a never-reused revision id), so cleanup still never lists the
namespace. Every part but the last must be at least `MIN_PART_SIZE` bytes (S3's rule, enforced
by the local store too so tests catch it).

`list` exists for fsck and orphan reports only. It is never namespace truth: what exists is what
the metadata shard says exists.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import re
import urllib.parse
from collections.abc import Callable, Iterator

from nokvfs.errors import InvalidInput

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB
MAX_PART_NUMBER = 10_000
MAX_KEY_BYTES = 1024
MAX_METADATA_BYTES = 2048
RESERVED_COMPONENT_PREFIX = ".nokv-"

_METADATA_KEY = re.compile(r"[a-z0-9][a-z0-9-]*")
_METADATA_VALUE = re.compile(r"(?:[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?)?")
_BAD_KEY_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What a store knows about one object. `list` leaves `metadata` empty (use `head`)."""

    key: str
    size: int
    etag: str
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class StoreStats:
    """Capacity figures; None where the backend cannot say without an expensive walk."""

    total_bytes: int | None
    free_bytes: int | None
    used_bytes: int | None


OnMultipart = Callable[[str], None]


class ObjectStore(abc.ABC):
    """Keys to immutable-by-convention byte strings. Thread-safe: one instance serves all threads."""

    url: str

    @abc.abstractmethod
    def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        metadata: dict[str, str] | None = None,
        content_sha256: bytes | None = None,
    ) -> str:
        """Store `data` at `key` atomically and durably; return the new etag.

        `if_none_match` creates only if the key is absent; `if_match` replaces only the object
        with that etag. At most one of them may be given. `content_sha256`: the raw SHA-256 the
        caller has just checked `data` has; a store that can vouch for its own bytes keeps it
        with the object for `get_vouched` (the local store does; S3 ignores it).
        """

    @abc.abstractmethod
    def put_file(
        self,
        key: str,
        path: str | os.PathLike,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
        metadata: dict[str, str] | None = None,
        on_multipart: OnMultipart | None = None,
    ) -> str:
        """Store the file at `path` (streamed, not loaded whole); return the etag.

        A backend that uploads large bodies in parts calls ``on_multipart(upload_id)`` after
        creating the upload and before sending any part, so the caller can record the id in its
        ledger; if the callback raises, the upload is aborted and the error propagates. A
        definite failure of a part aborts the upload; an ambiguous completion does not (the
        ledger owns it). `if_match` is refused for bodies large enough to need parts.
        """

    def put_many(
        self,
        items,
        *,
        if_none_match: bool = False,
        metadata: dict[str, str] | None = None,
        on_stored=None,
        content_sha256s: list | None = None,
    ) -> list:
        """Store several (key, data) objects as `put` would; returns, per item, its etag or the
        exception that refused it (the others are stored regardless). Backends override it to
        share work: the local store fsyncs each directory once, S3 sends the PUTs in parallel.
        `on_stored(index)`, if given, is called once an item is stored as durably as `put`
        stores it (from any thread): a caller waiting on a long batch sees it progress.
        `content_sha256s`, if given, holds each item's `content_sha256` (or None), in order."""
        results = []
        for index, (key, data) in enumerate(items):
            try:
                sha256 = None if content_sha256s is None else content_sha256s[index]
                results.append(
                    self.put(key, data, if_none_match=if_none_match, metadata=metadata, content_sha256=sha256)
                )
            except Exception as exc:  # noqa: BLE001 - reported per item
                results.append(exc)
            else:
                if on_stored is not None:
                    on_stored(index)
        return results

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[start, start + length)`` of the object, clipped at its end.

        ``start == size`` gives b""; ``start > size`` is InvalidInput; absent is ObjectMissing.
        """

    def get_vouched(self, key: str, length: int) -> tuple[bytes, bytes | None]:
        """Bytes ``[0, length)`` of the object (as `get`), and the raw SHA-256 the store vouches
        they have, or None. A store vouches only for an object it wrote with a `content_sha256`
        whose bytes it has just found unchanged since, and only when `length` covered them all;
        the caller still compares that digest with the one it expects. This base vouches for
        nothing."""
        return self.get(key, 0, length), None

    @abc.abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """Size, etag and metadata of the object, or None if it is absent."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object. Deleting an absent key succeeds."""

    def delete_many(self, keys) -> list:
        """Remove several objects as `delete` would; returns, per key, None once that object is
        absent or the exception that kept it (the others are removed regardless).

        None is the store's confirmation that the object is gone, not a guess: the local store
        answers only after the directory change is fsynced, S3 (read-after-delete consistent)
        only for a key its DeleteObjects answer lists as deleted. Backends override it to share
        work: the local store takes its lock once and fsyncs each touched directory once, S3
        sends up to 1,000 keys per request."""
        results = []
        for key in keys:
            try:
                self.delete(key)
                results.append(None)
            except Exception as exc:  # noqa: BLE001 - reported per key
                results.append(exc)
        return results

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, in key order. For fsck/orphan reports only."""

    @abc.abstractmethod
    def create_multipart(self, key: str, *, metadata: dict[str, str] | None = None) -> str:
        """Start a multipart upload to `key`; return its upload id."""

    @abc.abstractmethod
    def upload_part(self, key: str, upload_id: str, part_number: int, data: bytes) -> str:
        """Upload part `part_number` (1..10000) of the upload; return the part's etag.

        Re-uploading a part number replaces it. An unknown upload id is ObjectMissing.
        """

    @abc.abstractmethod
    def complete_multipart(
        self,
        key: str,
        upload_id: str,
        parts: list[tuple[int, str]],
        *,
        if_none_match: bool = False,
    ) -> str:
        """Assemble `parts` ((part_number, etag), ascending) into the object; return its etag."""

    @abc.abstractmethod
    def abort_multipart(self, key: str, upload_id: str) -> None:
        """Discard the upload and its parts. Aborting an unknown or finished upload succeeds."""

    @abc.abstractmethod
    def multipart_uploads(self, key: str) -> list[str]:
        """The ids of the unfinished multipart uploads to exactly `key` (not to keys it prefixes)."""

    @abc.abstractmethod
    def statfs(self) -> StoreStats:
        """Capacity figures for `statfs(2)` of a mount."""

    def remove_stale_temp_files(self, *, everywhere: bool = False) -> int:
        """Delete temporary files that writers which are gone left in the store; return how many.
        `everywhere` also walks the whole store (for `gc`), not only where temps are kept now.
        A store without temporary files (S3: unfinished uploads are aborted from the ledger)
        has nothing to sweep."""
        return 0

    def close(self) -> None:
        """Release connections and file descriptors. Idempotent."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


# --- argument checks shared by the backends ---------------------------------------------------


def stage_put(store, data, key_hint: str | None = None, content_sha256: bytes | None = None):
    """The first half of a put where the store's class offers one (LocalStore.stage_put): the
    bytes durable under no key (`key_hint` says which key they are meant for; `content_sha256`
    as for `put`), an object with `commit(key)` and `discard()`; None otherwise (the caller then
    puts). Looked up on the class, so a wrapper that forwards calls by `__getattr__` keeps its
    own `put` in the path."""
    method = getattr(type(store), "stage_put", None)
    return None if method is None else method(store, data, key_hint=key_hint, content_sha256=content_sha256)


def check_key(key: str) -> str:
    """`key` if it is a valid object key (see the module docstring), else InvalidInput."""
    if not isinstance(key, str) or not key:
        raise InvalidInput(f"object key must be a non-empty string, got {key!r}")
    _check_key_text(key, key)
    components = key.split("/")
    for component in components:
        if component in ("", ".", ".."):
            raise InvalidInput(f"object key has an empty, '.' or '..' component: {key!r}")
        if component.startswith(RESERVED_COMPONENT_PREFIX):
            raise InvalidInput(f"object key component {component!r} uses the reserved prefix: {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """`prefix` if it can begin a valid key ("" lists everything), else InvalidInput."""
    if not isinstance(prefix, str):
        raise InvalidInput(f"key prefix must be a string, got {prefix!r}")
    if not prefix:
        return prefix
    _check_key_text(prefix, prefix)
    # Every component but the last is whole and must be valid; the last may be partial.
    for component in prefix.split("/")[:-1]:
        if component in ("", ".", ".."):
            raise InvalidInput(f"key prefix has an empty, '.' or '..' component: {prefix!r}")
        if component.startswith(RESERVED_COMPONENT_PREFIX):
            raise InvalidInput(f"key prefix uses the reserved prefix: {prefix!r}")
    return prefix


def _check_key_text(text: str, shown: str) -> None:
    if text.startswith("/"):
        raise InvalidInput(f"object key must be relative: {shown!r}")
    if _BAD_KEY_CHARS.search(text):
        raise InvalidInput(f"object key contains a control character or backslash: {shown!r}")
    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"object key is not valid UTF-8: {shown!r}") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise InvalidInput(f"object key is longer than {MAX_KEY_BYTES} bytes: {shown[:80]!r}...")


def check_metadata(metadata: dict[str, str] | None) -> dict[str, str]:
    """A copy of `metadata` if both backends can store it exactly, else InvalidInput."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidInput(f"object metadata must be a dict, got {type(metadata).__name__}")
    total = 0
    for name, value in metadata.items():
        if not isinstance(name, str) or not _METADATA_KEY.fullmatch(name):
            raise InvalidInput(f"metadata key must match [a-z0-9][a-z0-9-]*, got {name!r}")
        if not isinstance(value, str) or not _METADATA_VALUE.fullmatch(value):
            raise InvalidInput(f"metadata value for {name!r} must be trimmed printable ASCII, got {value!r}")
        total += len(name) + len(value)
    if total > MAX_METADATA_BYTES:
        raise InvalidInput(f"object metadata is {total} bytes, more than {MAX_METADATA_BYTES}")
    return dict(metadata)


def check_conditions(if_none_match: bool, if_match: str | None) -> None:
    if if_none_match and if_match is not None:
        raise InvalidInput("if_none_match and if_match are mutually exclusive")
    if if_match is not None and (not isinstance(if_match, str) or not if_match or '"' in if_match):
        raise InvalidInput(f"if_match must be a non-empty unquoted etag, got {if_match!r}")


def check_range(start: int, length: int | None) -> None:
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise InvalidInput(f"range start must be a non-negative integer, got {start!r}")
    if length is not None and (not isinstance(length, int) or isinstance(length, bool) or length < 0):
        raise InvalidInput(f"range length must be a non-negative integer or None, got {length!r}")


def check_part_number(part_number: int) -> int:
    if not isinstance(part_number, int) or isinstance(part_number, bool) or not 1 <= part_number <= MAX_PART_NUMBER:
        raise InvalidInput(f"part number must be 1..{MAX_PART_NUMBER}, got {part_number!r}")
    return part_number


def check_parts(parts: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """`parts` as a list if non-empty, strictly ascending and well-formed, else InvalidInput."""
    checked = []
    previous = 0
    for item in parts:
        try:
            part_number, etag = item
        except (TypeError, ValueError):
            raise InvalidInput(f"a part must be (part_number, etag), got {item!r}") from None
        check_part_number(part_number)
        if part_number <= previous:
            raise InvalidInput(f"parts must be strictly ascending by part number, got {part_number} after {previous}")
        if not isinstance(etag, str) or not etag:
            raise InvalidInput(f"part {part_number} has no etag")
        previous = part_number
        checked.append((part_number, etag.strip('"')))
    if not checked:
        raise InvalidInput("a multipart upload needs at least one part")
    return checked


# --- opening a store by URL -------------------------------------------------------------------


def open_store(url: str, *, endpoint_url: str | None = None, region: str | None = None, **options) -> ObjectStore:
    """The store a URL names.

    ``file:///abs/dir`` or a bare filesystem path opens a `LocalStore` (`options`: ``create``);
    ``s3://bucket[/prefix]`` opens an `S3Store` (`options`: see `S3Store`), talking to
    `endpoint_url` if given (any S3-compatible service) and signing for `region`.
    """
    if not isinstance(url, str) or not url:
        raise InvalidInput(f"object store URL must be a non-empty string, got {url!r}")
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme in ("", "file"):
        if parsed.scheme == "file":
            if parsed.netloc not in ("", "localhost") or parsed.query or parsed.fragment:
                raise InvalidInput(f"a file URL must be file:///absolute/path, got {url!r}")
            path = urllib.parse.unquote(parsed.path)
            if not path.startswith("/"):
                raise InvalidInput(f"a file URL must name an absolute path, got {url!r}")
        else:
            path = os.path.abspath(url)
        if endpoint_url is not None or region is not None:
            raise InvalidInput("endpoint_url and region apply to s3:// stores only")
        from nokvfs.objects.local import LocalStore

        return LocalStore(path, **options)
    if parsed.scheme == "s3":
        if parsed.query or parsed.fragment or not parsed.netloc:
            raise InvalidInput(f"an S3 URL must be s3://bucket[/prefix], got {url!r}")
        from nokvfs.objects.s3 import S3Store

        return S3Store(
            parsed.netloc,
            urllib.parse.unquote(parsed.path.lstrip("/")),
            endpoint_url=endpoint_url,
            region=region,
            **options,
        )
    raise InvalidInput(f"unsupported object store URL scheme {parsed.scheme!r} in {url!r}")
