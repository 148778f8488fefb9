"""The S3 object store (any S3-compatible service) on boto3.

Credentials and region come from the usual AWS configuration (environment, shared config and
credential files, profiles, instance roles) unless passed explicitly. Keys are stored under an
optional prefix inside one bucket.

Deadlines. Every call runs within a budget: each attempt has a connect timeout and a read
timeout (seconds of silence on the socket), at most `max_attempts` attempts are made, and a retry
starts only if a whole attempt still fits before the call's `deadline` (default 30 s from the
call). So an endpoint that accepts connections and never answers makes a call fail within the
deadline -- StoreTimeout, or AmbiguousTimeout for a mutation that was sent (see below) -- while a
transfer that keeps moving is never cut off. botocore itself never retries: every retry is ours,
inside the budget.

Retries and ambiguity. Reads (GET, HEAD, list) are retried on throttling, 5xx answers, refused
connections and lost answers. Mutations are not retried blindly, because a blind retry can turn a
lost response into a wrong answer: a conditional PUT whose first attempt succeeded but whose
response was lost would be retried, get 412, and report a race it actually won. Instead
`_mutate` retries only what provably did not take effect (connection refused, connect timeout,
SlowDown and other throttling answers) and classifies everything else:

* the request was sent and no answer came back (read timeout, connection reset or closed,
  truncated response, 5xx or InternalError other than SlowDown): AmbiguousResult, straight away for non-idempotent
  requests (conditional PUT, CreateMultipartUpload, CompleteMultipartUpload), and after the
  bounded retries for idempotent ones (plain PUT, UploadPart, DELETE, DeleteObjects,
  AbortMultipartUpload; DeleteObjects also answers per key, and `delete_many` classifies each
  key's answer the same way);
  an idempotent request that ends in a definite error after an earlier ambiguous attempt is
  still AmbiguousResult, since that earlier attempt may have applied;
* 412 PreconditionFailed and 409 ConditionalRequestConflict: PreconditionFailed; a 404 on an
  `if_match` PUT (the object is gone) is PreconditionFailed too;
* NoSuchKey/404: ObjectMissing; NoSuchUpload: ObjectMissing naming the upload;
* EntityTooLarge, quota and storage-full codes, HTTP 507: StoreFull;
* InvalidPart, InvalidPartOrder, EntityTooSmall: InvalidInput;
* anything else: StoreError with the S3 error code.

A read that fails for lack of an answer is StoreError, StoreTimeout when the answer timed out (a
read has no outcome to be unsure of); an ambiguous mutation whose answer timed out is
AmbiguousTimeout, both an AmbiguousResult and a StoreTimeout.

HEAD cannot tell a missing key from a missing bucket (neither has a body), so the bucket is
checked once: when the store is opened (`verify_bucket`, the default), or else at the first 404
from `head`, so that opening never waits on the endpoint (a data directory's root opens its store
that way: the mount starts, and answers what needs no store, while the endpoint is silent).
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import random
import re
import time
from collections.abc import Callable, Iterator

import boto3
import botocore.config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    IncompleteReadError,
    ParamValidationError,
    ProxyConnectionError,
    ReadTimeoutError,
    SSLError,
)

from nokvfs.errors import (
    AmbiguousResult,
    AmbiguousTimeout,
    InvalidInput,
    NokvError,
    ObjectMissing,
    PreconditionFailed,
    StoreError,
    StoreFull,
    StoreTimeout,
)
from nokvfs.objects.store import (
    MAX_PART_NUMBER,
    MIN_PART_SIZE,
    MiB,
    ObjectInfo,
    ObjectStore,
    OnMultipart,
    StoreStats,
    check_conditions,
    check_key,
    check_metadata,
    check_part_number,
    check_parts,
    check_prefix,
    check_range,
)

log = logging.getLogger(__name__)

DEFAULT_MULTIPART_THRESHOLD = 64 * MiB
DEFAULT_PART_SIZE = 16 * MiB
# A whole call returns within DEFAULT_DEADLINE on an endpoint that never answers: two attempts
# of (connect + read timeout) fit in it, a third does not start.
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 10.0
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_DEADLINE = 30.0
PARALLEL_PUTS = 8  # concurrent PUTs of one put_many (the client pool holds 16 connections)
DELETE_BATCH = 1000  # keys per DeleteObjects request: S3's limit
# The options a data directory's configuration may set for its S3 store ("store_options").
TIMEOUT_OPTIONS = ("connect_timeout", "read_timeout", "max_attempts", "deadline")

# Failed before the request left this machine: safe to retry any request.
_NOT_SENT = (EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError)
# Sent (or possibly sent), and no complete answer came back.
_NO_ANSWER = (HTTPClientError, SSLError, IncompleteReadError)
# No answer within a timeout (connect or read).
_TIMED_OUT = (ConnectTimeoutError, ReadTimeoutError)

# Answers that say the request was refused without effect: retried by any request.
_REFUSED_CODES = {
    "SlowDown",
    "ServiceUnavailable",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "RequestThrottled",
    "RequestTimeout",  # the server gave up waiting for our request body
}
# Server-side failures with an unknown outcome, whatever the HTTP status says (S3 can answer
# CompleteMultipartUpload with 200 and an error document).
_SERVER_FAILURE_CODES = {"InternalError", "InternalFailure"}
_FULL_CODES = {
    "EntityTooLarge",
    "QuotaExceeded",
    "StorageQuotaExceeded",
    "InsufficientStorage",
    "StorageFull",
    "XMinioStorageFull",
    "XMinioAdminBucketQuotaExceeded",
}
_INVALID_CODES = {"InvalidPart", "InvalidPartOrder", "EntityTooSmall"}
_PRECONDITION_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}
_MISSING_KEY_CODES = {"NoSuchKey", "404", "NotFound"}
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_IPV4 = re.compile(r"\d+\.\d+\.\d+\.\d+")


def check_bucket_name(bucket: str) -> str:
    """`bucket` if it is a DNS-compatible S3 bucket name, else InvalidInput."""
    if (
        not isinstance(bucket, str)
        or not _BUCKET_NAME.fullmatch(bucket)
        or ".." in bucket
        or ".-" in bucket
        or "-." in bucket
        or _IPV4.fullmatch(bucket)
    ):
        raise InvalidInput(f"not a valid DNS-compatible bucket name: {bucket!r}")
    return bucket


def _error_fields(exc: ClientError) -> tuple[str, int, str]:
    error = exc.response.get("Error", {})
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return str(error.get("Code", "")), int(status or 0), str(error.get("Message", ""))


def _definite_refusal(code: str, status: int) -> bool:
    """A 5xx answer that still says nothing was stored (507 Insufficient Storage and kin)."""
    return code in _FULL_CODES or status == 507


def _quoted(etag: str) -> str:
    return f'"{etag}"'


def _unquoted(etag: str | None) -> str:
    return (etag or "").strip('"')


class S3Store(ObjectStore):
    """Objects in `bucket` under `prefix` (``""`` or a key prefix; a trailing ``/`` is implied).

    `multipart_threshold`: `put_file` bodies larger than this use multipart upload in parts of
    `part_size` (grown if needed to stay within 10000 parts). `max_attempts` bounds every retry
    loop; `connect_timeout` and `read_timeout` are seconds per attempt; `deadline` is the budget
    of one whole call, retries included (at least one attempt's connect + read timeout).
    `addressing_style` defaults to "path" with a custom `endpoint_url` and "auto" otherwise.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        profile: str | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        deadline: float = DEFAULT_DEADLINE,
        retry_base_delay: float = 0.1,
        retry_max_delay: float = 5.0,
        addressing_style: str | None = None,
        max_pool_connections: int = 16,
        request_checksum_calculation: str = "when_supported",
        verify_bucket: bool = True,
    ):
        self.bucket = check_bucket_name(bucket)
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
            prefix += "/"
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}"
        if not isinstance(part_size, int) or part_size < MIN_PART_SIZE:
            raise InvalidInput(f"part_size must be at least {MIN_PART_SIZE} bytes, got {part_size!r}")
        if not isinstance(multipart_threshold, int) or multipart_threshold < 0:
            raise InvalidInput(f"multipart_threshold must be a non-negative integer, got {multipart_threshold!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInput(f"max_attempts must be a positive integer, got {max_attempts!r}")
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("read_timeout", read_timeout),
            ("deadline", deadline),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise InvalidInput(f"{name} must be a number of seconds in (0, 3600], got {value!r}")
        if connect_timeout + read_timeout > deadline:
            raise InvalidInput(
                f"deadline {deadline} s must leave room for one attempt (connect {connect_timeout} s + read "
                f"{read_timeout} s)"
            )
        self.deadline = float(deadline)
        self._attempt_seconds = connect_timeout + read_timeout
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self._max_attempts = max_attempts
        self._retry_base_delay = retry_base_delay
        self._retry_max_delay = retry_max_delay
        try:
            session = boto3.session.Session(
                aws_access_key_id=aws_access_key_id,
                aws_secret_access_key=aws_secret_access_key,
                aws_session_token=aws_session_token,
                region_name=region,
                profile_name=profile,
            )
        except BotoCoreError as exc:
            raise StoreError(f"cannot configure S3 access for {self.url}: {exc}") from exc
        self.region = region or session.region_name or "us-east-1"
        common = dict(
            region_name=self.region,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_pool_connections=max_pool_connections,
            s3={"addressing_style": addressing_style or ("path" if endpoint_url else "auto")},
            request_checksum_calculation=request_checksum_calculation,
            response_checksum_validation="when_supported",
            user_agent_extra="nokvfs",
        )
        # botocore sends each request once: retries are ours, within the call's deadline.
        read_config = botocore.config.Config(retries={"mode": "standard", "total_max_attempts": 1}, **common)
        write_config = botocore.config.Config(retries={"mode": "standard", "total_max_attempts": 1}, **common)
        try:
            self._reader = session.client("s3", endpoint_url=endpoint_url, config=read_config)
            self._writer = session.client("s3", endpoint_url=endpoint_url, config=write_config)
        except (BotoCoreError, ValueError) as exc:
            raise StoreError(f"cannot create an S3 client for {self.url}: {exc}") from exc
        self._bucket_verified = False
        if verify_bucket:
            self._verify_bucket()

    def __repr__(self) -> str:
        return f"S3Store({self.url!r})"

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    def _verify_bucket(self) -> None:
        try:
            self._read("open bucket", "", lambda c: c.head_bucket(Bucket=self.bucket))
        except ObjectMissing:
            raise StoreError(f"bucket {self.bucket} does not exist (opening {self.url})") from None
        self._bucket_verified = True

    # --- request classification -------------------------------------------------------------

    def _map_client_error(self, exc: ClientError, op: str, key: str, *, if_match: bool = False) -> Exception:
        code, status, message = _error_fields(exc)
        where = f"{op} {self.url}{key}"
        if code in _PRECONDITION_CODES or status == 412:
            return PreconditionFailed(f"{where}: {code or status}: {message}")
        if code == "NoSuchUpload":
            return ObjectMissing(f"{where}: no such multipart upload")
        if code == "NoSuchBucket":
            return StoreError(f"{where}: NoSuchBucket: bucket {self.bucket} does not exist")
        if code in _MISSING_KEY_CODES or status == 404:
            if if_match:
                return PreconditionFailed(f"{where}: if_match on an absent object")
            return ObjectMissing(f"{where}: object is absent")
        if code in _FULL_CODES or status == 507:
            return StoreFull(f"{where}: {code or status}: {message}")
        if code in _INVALID_CODES:
            return InvalidInput(f"{where}: {code}: {message}")
        return StoreError(f"{where}: {code or 'HTTP ' + str(status)} (HTTP {status}): {message}")

    def _attempts(self):
        """Attempt numbers (1, 2, ...) of one call: at most max_attempts, each retry after a
        backoff and only while a whole attempt still fits before the call's deadline."""
        end = time.monotonic() + self.deadline
        for attempt in range(1, self._max_attempts + 1):
            if attempt > 1:
                delay = min(self._retry_max_delay, self._retry_base_delay * (2 ** (attempt - 2)))
                delay *= random.uniform(0.5, 1.0)
                if time.monotonic() + delay + self._attempt_seconds > end:
                    return
                time.sleep(delay)
            yield attempt

    def _exhausted(self, where: str, attempts: int, last: BaseException | None) -> StoreError:
        """The error of a call whose attempts ran out without an answer (timed out: StoreTimeout)."""
        cls = StoreTimeout if isinstance(last, _TIMED_OUT) else StoreError
        return cls(f"{where} failed after {attempts} attempt(s) within its {self.deadline:g} s deadline: {last}")

    def _read(self, op: str, key: str, call: Callable):
        """Run a read, retrying what can be retried within the call's deadline; map failures."""
        last: BaseException | None = None
        attempts = 0
        for attempts in self._attempts():  # noqa: B007 - the count is reported after the loop
            try:
                return call(self._reader)
            except ClientError as exc:
                code, status, _ = _error_fields(exc)
                if code in _REFUSED_CODES or status == 429 or status >= 500 or code in _SERVER_FAILURE_CODES:
                    last = exc
                    continue
                raise self._map_client_error(exc, op, key) from exc
            except ParamValidationError as exc:
                raise InvalidInput(f"{op} {self.url}{key}: {exc}") from exc
            except (*_NOT_SENT, *_NO_ANSWER) as exc:
                last = exc
            except BotoCoreError as exc:
                raise StoreError(f"{op} {self.url}{key} failed: {exc}") from exc
        if isinstance(last, ClientError):
            raise self._map_client_error(last, op, key) from last
        raise self._exhausted(f"{op} {self.url}{key}", attempts, last) from last

    def _mutate(self, op: str, key: str, call: Callable, *, idempotent: bool, if_match: bool = False, ok_codes=()):
        """Run a mutation on the non-retrying client with our own bounded, outcome-aware retries.

        Returns the response, or None when the error code is in `ok_codes` (e.g. NoSuchUpload
        for an abort: the upload is gone either way).
        """
        lost: BaseException | None = None  # an attempt that may have been applied
        last: BaseException | None = None
        where = f"{op} {self.url}{key}"
        attempts = 0
        for attempts in self._attempts():  # noqa: B007 - the count is reported after the loop
            try:
                return call(self._writer)
            except _NOT_SENT as exc:
                last = exc
            except ClientError as exc:
                code, status, _ = _error_fields(exc)
                if code in ok_codes:
                    return None
                if code in _REFUSED_CODES or status == 429:
                    last = exc
                elif (status >= 500 or code in _SERVER_FAILURE_CODES) and not _definite_refusal(code, status):
                    if not idempotent:
                        raise AmbiguousResult(f"{where}: HTTP {status} {code}; outcome unknown") from exc
                    lost = last = exc
                else:
                    if lost is not None:
                        raise AmbiguousResult(
                            f"{where}: {code} after an earlier attempt's outcome was lost ({lost})"
                        ) from exc
                    raise self._map_client_error(exc, op, key, if_match=if_match) from exc
            except _NO_ANSWER as exc:
                if not idempotent:
                    ambiguous = AmbiguousTimeout if isinstance(exc, _TIMED_OUT) else AmbiguousResult
                    raise ambiguous(f"{where}: sent, no answer ({exc}); outcome unknown") from exc
                lost = last = exc
            except ParamValidationError as exc:
                raise InvalidInput(f"{where}: {exc}") from exc
            except BotoCoreError as exc:
                # Credentials, region and similar failures happen before anything is sent.
                raise StoreError(f"{where} failed before sending: {exc}") from exc
        if lost is not None:
            ambiguous = AmbiguousTimeout if isinstance(last, _TIMED_OUT) else AmbiguousResult
            raise ambiguous(
                f"{where}: {attempts} attempt(s) within its {self.deadline:g} s deadline, an outcome was lost ({lost})"
            ) from lost
        if isinstance(last, ClientError):
            raise self._map_client_error(last, op, key) from last
        raise self._exhausted(where, attempts, last) from last

    # --- the interface ------------------------------------------------------------------------

    def put(self, key, data, *, if_none_match=False, if_match=None, metadata=None, content_sha256=None) -> str:
        # `content_sha256` is not kept: nothing here could vouch that the bytes a GET returns are
        # still the ones it described (reads verify the SHA-256 themselves).
        full = self._key(key)
        check_conditions(if_none_match, if_match)
        metadata = check_metadata(metadata)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidInput(f"object data must be bytes, got {type(data).__name__}")
        body = bytes(data)
        params = self._put_params(full, metadata, if_none_match, if_match)
        response = self._mutate(
            "put",
            key,
            lambda c: c.put_object(Body=body, **params),
            idempotent=not (if_none_match or if_match),
            if_match=if_match is not None,
        )
        return _unquoted(response.get("ETag"))

    def put_many(self, items, *, if_none_match=False, metadata=None, on_stored=None, content_sha256s=None) -> list:
        """The PUTs sent in parallel (at most PARALLEL_PUTS at once, within the connection pool),
        each with its own deadline and retries; per item its etag or its exception."""
        items = list(items)
        if len(items) <= 1:
            return super().put_many(items, if_none_match=if_none_match, metadata=metadata, on_stored=on_stored)

        def one(index):
            key, data = items[index]
            try:
                etag = self.put(key, data, if_none_match=if_none_match, metadata=metadata)
            except Exception as exc:  # noqa: BLE001 - reported per item
                return exc
            if on_stored is not None:
                on_stored(index)
            return etag

        with concurrent.futures.ThreadPoolExecutor(
            max_workers=min(PARALLEL_PUTS, len(items)), thread_name_prefix="s3-put"
        ) as pool:
            return list(pool.map(one, range(len(items))))

    def _put_params(self, full: str, metadata, if_none_match: bool, if_match: str | None) -> dict:
        params = {"Bucket": self.bucket, "Key": full}
        if metadata:
            params["Metadata"] = metadata
        if if_none_match:
            params["IfNoneMatch"] = "*"
        if if_match is not None:
            params["IfMatch"] = _quoted(if_match)
        return params

    def put_file(self, key, path, *, if_none_match=False, if_match=None, metadata=None, on_multipart=None) -> str:
        full = self._key(key)
        check_conditions(if_none_match, if_match)
        metadata = check_metadata(metadata)
        source = os.fspath(path)
        try:
            f = open(source, "rb")
        except OSError as exc:
            raise StoreError(f"cannot open source file {source}: {exc.strerror}") from exc
        with f:
            size = os.fstat(f.fileno()).st_size
            if size <= self.multipart_threshold:
                params = self._put_params(full, metadata, if_none_match, if_match)

                def call(client):
                    f.seek(0)
                    return client.put_object(Body=f, **params)

                response = self._mutate(
                    "put", key, call, idempotent=not (if_none_match or if_match), if_match=if_match is not None
                )
                return _unquoted(response.get("ETag"))
            if if_match is not None:
                raise InvalidInput(f"if_match is not supported for a multipart body ({size} bytes) at {key}")
            return self._put_multipart(key, f, source, size, metadata, if_none_match, on_multipart)

    def _put_multipart(self, key, f, source, size, metadata, if_none_match, on_multipart: OnMultipart | None) -> str:
        part_size = max(self.part_size, math.ceil(size / MAX_PART_NUMBER))
        upload_id = self.create_multipart(key, metadata=metadata)
        try:
            if on_multipart is not None:
                on_multipart(upload_id)
            parts = []
            part_number = 1
            while True:
                try:
                    chunk = f.read(part_size)
                except OSError as exc:
                    raise StoreError(f"cannot read source file {source}: {exc.strerror}") from exc
                if not chunk:
                    break
                parts.append((part_number, self.upload_part(key, upload_id, part_number, chunk)))
                part_number += 1
        except BaseException:
            self._abort_quietly(key, upload_id)
            raise
        try:
            return self.complete_multipart(key, upload_id, parts, if_none_match=if_none_match)
        except AmbiguousResult:
            raise  # the object may exist: the caller's ledger reconciles, we must not abort blindly
        except BaseException:
            self._abort_quietly(key, upload_id)
            raise

    def _abort_quietly(self, key: str, upload_id: str) -> None:
        try:
            self.abort_multipart(key, upload_id)
        except Exception as exc:  # noqa: BLE001 - the original failure matters more; the ledger retries aborts
            log.warning("could not abort multipart upload %s of %s%s: %s", upload_id, self.url, key, exc)

    def get(self, key, start=0, length=None) -> bytes:
        full = self._key(key)
        check_range(start, length)
        if length == 0:
            return self._empty_range(key, start, refused=False)
        params = {"Bucket": self.bucket, "Key": full}
        if start or length is not None:
            end = "" if length is None else str(start + length - 1)
            params["Range"] = f"bytes={start}-{end}"
        last: BaseException | None = None
        attempts = 0
        for attempts in self._attempts():  # noqa: B007 - the count is reported after the loop
            try:
                response = self._reader.get_object(**params)
                data = response["Body"].read()
            except ClientError as exc:
                code, status, _ = _error_fields(exc)
                if code == "InvalidRange" or status == 416:
                    return self._empty_range(key, start, refused=True)
                if code in _REFUSED_CODES or status == 429 or status >= 500 or code in _SERVER_FAILURE_CODES:
                    last = exc
                    continue
                raise self._map_client_error(exc, "get", key) from exc
            except (*_NOT_SENT, *_NO_ANSWER) as exc:
                # No answer, or the body broke off mid-stream: a read can simply be sent again.
                last = exc
                continue
            except BotoCoreError as exc:
                raise StoreError(f"get {self.url}{key} failed: {exc}") from exc
            if "Range" in params and not response.get("ContentRange"):
                # A server that ignores Range sends the whole object.
                data = data[start:] if length is None else data[start : start + length]
            return data
        if isinstance(last, ClientError):
            raise self._map_client_error(last, "get", key) from last
        raise self._exhausted(f"get {self.url}{key}", attempts, last) from last

    def _empty_range(self, key: str, start: int, *, refused: bool) -> bytes:
        """b"" for an empty range (``length == 0``, or a start at the end that the server
        `refused` with 416), after checking the object exists and `start` is within it."""
        info = self.head(key)
        if info is None:
            raise ObjectMissing(f"get {self.url}{key}: object is absent")
        if start > info.size:
            raise InvalidInput(f"range start {start} is beyond the end of {key} ({info.size} bytes)")
        if refused and start < info.size:
            raise StoreError(f"get {self.url}{key}: the server refused range start {start} of {info.size} bytes")
        return b""

    def head(self, key) -> ObjectInfo | None:
        full = self._key(key)
        try:
            response = self._read("head", key, lambda c: c.head_object(Bucket=self.bucket, Key=full))
        except ObjectMissing:
            if not self._bucket_verified:
                self._verify_bucket()  # a missing bucket is a StoreError, not an absent object
            return None
        return ObjectInfo(
            key=key,
            size=int(response["ContentLength"]),
            etag=_unquoted(response.get("ETag")),
            metadata=dict(response.get("Metadata") or {}),
        )

    def delete(self, key) -> None:
        full = self._key(key)
        self._mutate(
            "delete",
            key,
            lambda c: c.delete_object(Bucket=self.bucket, Key=full),
            idempotent=True,
            ok_codes=("NoSuchKey",),
        )

    def delete_many(self, keys) -> list:
        """DeleteObjects requests of up to `delete_batch` keys, answered per key: None for a key
        the answer lists as deleted (S3 deletes are read-after-write consistent, so that is a
        confirmation). A per-key throttling or server failure is sent again with the keys still
        waiting, while the call's deadline allows; it ends as AmbiguousResult when a server
        failure may have applied, and any other per-key error is mapped as `delete` maps it. A
        request that fails as a whole fails each of its keys with its error."""
        results: list = []
        positions: dict[str, list[int]] = {}  # full key -> where it was asked (a key may repeat)
        for key in keys:
            try:
                positions.setdefault(self._key(key), []).append(len(results))
                results.append(None)
            except InvalidInput as exc:
                results.append(exc)
        full_keys = list(positions)
        for start in range(0, len(full_keys), self.delete_batch):
            for full, outcome in self._delete_objects(full_keys[start : start + self.delete_batch]).items():
                for position in positions[full]:
                    results[position] = outcome
        return results

    delete_batch = DELETE_BATCH

    def _delete_objects(self, full_keys: list) -> dict:
        """One batch of `delete_many`: full key -> None or its exception."""
        outcomes: dict = {}
        waiting = list(full_keys)
        lost: dict[str, str] = {}  # full key -> the per-key failure that may have applied
        attempts = 0
        for attempts in self._attempts():  # noqa: B007 - the count is reported after the loop
            try:
                response = self._mutate(
                    "delete",
                    f" ({len(waiting)} keys, the first {waiting[0][len(self.prefix) :]})",
                    lambda c, batch=tuple(waiting): c.delete_objects(
                        Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": False}
                    ),
                    idempotent=True,
                )
            except NokvError as exc:
                return outcomes | {full: exc for full in waiting}
            deleted = {item.get("Key") for item in response.get("Deleted", ())}
            errors = {item.get("Key"): item for item in response.get("Errors", ())}
            again = []
            for full in waiting:
                key = full[len(self.prefix) :]
                error = errors.get(full)
                if full in deleted:
                    outcomes[full] = None
                elif error is None:  # neither deleted nor refused: no answer for it
                    lost[full] = "the answer did not mention the key"
                    again.append(full)
                else:
                    code, message = str(error.get("Code", "")), str(error.get("Message", ""))
                    if code in _MISSING_KEY_CODES:
                        outcomes[full] = None  # absent: what a delete wants
                    elif code in _REFUSED_CODES:
                        again.append(full)
                    elif code in _SERVER_FAILURE_CODES:
                        lost[full] = f"{code}: {message}"
                        again.append(full)
                    elif full in lost:
                        outcomes[full] = AmbiguousResult(
                            f"delete {self.url}{key}: {code} after an earlier attempt's outcome was lost ({lost[full]})"
                        )
                    else:
                        refused = ClientError({"Error": {"Code": code, "Message": message}}, "DeleteObjects")
                        outcomes[full] = self._map_client_error(refused, "delete", key)
            waiting = again
            if not waiting:
                return outcomes
        for full in waiting:
            where = f"delete {self.url}{full[len(self.prefix) :]}"
            outcomes[full] = (
                AmbiguousResult(
                    f"{where}: {attempts} attempt(s) within its {self.deadline:g} s deadline, "
                    f"an outcome was lost ({lost[full]})"
                )
                if full in lost
                else StoreError(
                    f"{where}: refused (throttled) on {attempts} attempt(s) within its {self.deadline:g} s deadline"
                )
            )
        return outcomes

    def list(self, prefix="") -> Iterator[ObjectInfo]:
        check_prefix(prefix)
        return self._list(prefix)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        # One request per page, each retried on its own (a paginator cannot resume a page).
        token: dict = {}
        while True:
            page = self._read(
                "list",
                prefix,
                lambda c, token=token: c.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix + prefix, **token),
            )
            for item in page.get("Contents", ()):
                yield ObjectInfo(
                    key=item["Key"][len(self.prefix) :], size=int(item["Size"]), etag=_unquoted(item.get("ETag"))
                )
            if not page.get("IsTruncated"):
                return
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def statfs(self) -> StoreStats:
        """S3 has no capacity to report, and the bucket is never listed to count usage."""
        return StoreStats(total_bytes=None, free_bytes=None, used_bytes=None)

    # --- multipart ----------------------------------------------------------------------------

    def create_multipart(self, key, *, metadata=None) -> str:
        full = self._key(key)
        metadata = check_metadata(metadata)
        params = {"Bucket": self.bucket, "Key": full}
        if metadata:
            params["Metadata"] = metadata
        response = self._mutate(
            "create multipart upload", key, lambda c: c.create_multipart_upload(**params), idempotent=False
        )
        return response["UploadId"]

    def upload_part(self, key, upload_id, part_number, data) -> str:
        full = self._key(key)
        check_part_number(part_number)
        if not isinstance(upload_id, str) or not upload_id:
            raise InvalidInput(f"upload id must be a non-empty string, got {upload_id!r}")
        body = bytes(data)
        response = self._mutate(
            f"upload part {part_number} of",
            key,
            lambda c: c.upload_part(
                Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=part_number, Body=body
            ),
            idempotent=True,
        )
        return _unquoted(response.get("ETag"))

    def complete_multipart(self, key, upload_id, parts, *, if_none_match=False) -> str:
        full = self._key(key)
        parts = check_parts(parts)
        params = {
            "Bucket": self.bucket,
            "Key": full,
            "UploadId": upload_id,
            "MultipartUpload": {"Parts": [{"PartNumber": n, "ETag": _quoted(etag)} for n, etag in parts]},
        }
        if if_none_match:
            params["IfNoneMatch"] = "*"
        response = self._mutate(
            "complete multipart upload", key, lambda c: c.complete_multipart_upload(**params), idempotent=False
        )
        return _unquoted(response.get("ETag"))

    def abort_multipart(self, key, upload_id) -> None:
        full = self._key(key)
        self._mutate(
            "abort multipart upload",
            key,
            lambda c: c.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id),
            idempotent=True,
            ok_codes=("NoSuchUpload",),
        )

    def multipart_uploads(self, key) -> list[str]:
        full = self._key(key)
        found, markers = [], {}
        while True:
            response = self._read(
                "list multipart uploads",
                key,
                lambda c, markers=markers: c.list_multipart_uploads(Bucket=self.bucket, Prefix=full, **markers),
            )
            found += [u["UploadId"] for u in response.get("Uploads", ()) if u.get("Key") == full]
            if not response.get("IsTruncated"):
                return found
            markers = {"KeyMarker": response["NextKeyMarker"], "UploadIdMarker": response["NextUploadIdMarker"]}

    def close(self) -> None:
        for client in (self._reader, self._writer):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best-effort
                pass
