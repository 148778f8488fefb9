"""The S3 object store against a real S3 wire endpoint on loopback (moto's server): the shared
contract, plus what only a network store can show (conditional writes that are never retried
blindly, multipart ids visible before parts, unreachable and silent servers)."""

from __future__ import annotations

import os
import time

import pytest

from nokvfs.errors import (
    AmbiguousResult,
    AmbiguousTimeout,
    InvalidInput,
    ObjectMissing,
    PreconditionFailed,
    StoreError,
    StoreFull,
    StoreTimeout,
)
from nokvfs.objects.s3 import S3Store
from nokvfs.objects.store import MIN_PART_SIZE, MiB, StoreStats, open_store

pytest.register_assert_rewrite("tests.object_store_contract")
from tests.object_store_contract import *  # noqa: E402, F403 - the shared behaviour tests

pytest_plugins = ["tests.s3_fixtures"]

FAST = dict(retry_base_delay=0.01, retry_max_delay=0.05)


def _store(bucket, endpoint, prefix="t", **options):
    return S3Store(
        bucket,
        prefix,
        endpoint_url=endpoint,
        multipart_threshold=6 * MiB,
        part_size=MIN_PART_SIZE,
        **{**FAST, **options},
    )


@pytest.fixture
def store(s3_bucket, s3_endpoint):
    with _store(s3_bucket, s3_endpoint) as s:
        yield s


@pytest.fixture
def other_store(s3_bucket, s3_endpoint):
    with _store(s3_bucket, s3_endpoint) as s:
        yield s


def _uploads(client, bucket):
    return [(u["Key"], u["UploadId"]) for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]


# --- layout in the bucket ---------------------------------------------------------------------


def test_keys_live_under_the_store_prefix_and_prefixes_are_isolated(s3_bucket, s3_endpoint, s3_client):
    a = _store(s3_bucket, s3_endpoint, prefix="tenant-a")
    b = _store(s3_bucket, s3_endpoint, prefix="tenant-b/")
    a.put("obj", b"from a")
    b.put("obj", b"from b")
    raw = sorted(o["Key"] for o in s3_client.list_objects_v2(Bucket=s3_bucket)["Contents"])
    assert raw == ["tenant-a/obj", "tenant-b/obj"]
    assert a.get("obj") == b"from a" and b.get("obj") == b"from b"
    assert [i.key for i in a.list("")] == ["obj"]


def test_open_store_parses_s3_urls(s3_bucket, s3_endpoint):
    store = open_store(f"s3://{s3_bucket}/some/prefix", endpoint_url=s3_endpoint, region="us-east-1")
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.region) == (s3_bucket, "some/prefix/", "us-east-1")
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert store.statfs() == StoreStats(None, None, None)


@pytest.mark.parametrize(
    "bucket", ["ab", "Upper-case", "under_score", "-lead", "trail-", "a..b", "192.168.1.1", "x" * 64]
)
def test_invalid_bucket_names_are_refused(bucket, s3_endpoint):
    with pytest.raises(InvalidInput):
        S3Store(bucket, endpoint_url=s3_endpoint)


def test_a_missing_bucket_is_a_store_error_at_open(s3_endpoint):
    with pytest.raises(StoreError, match="does not exist"):
        S3Store("nokv-no-such-bucket", endpoint_url=s3_endpoint)


# --- conditional writes on the wire -----------------------------------------------------------


def test_conditional_put_lost_race_is_a_412_precondition_failed(store, s3_client, s3_bucket):
    s3_client.put_object(Bucket=s3_bucket, Key="t/race/raw", Body=b"somebody else")
    with pytest.raises(PreconditionFailed, match="PreconditionFailed"):
        store.put("race/raw", b"mine", if_none_match=True)
    current = store.head("race/raw").etag
    s3_client.put_object(Bucket=s3_bucket, Key="t/race/raw", Body=b"changed behind us")
    with pytest.raises(PreconditionFailed):
        store.put("race/raw", b"mine", if_match=current)
    assert store.get("race/raw") == b"changed behind us"


# --- multipart: the upload id belongs to the ledger before any part ----------------------------


def test_upload_id_exists_on_the_server_before_any_part(store, s3_client, s3_bucket):
    upload_id = store.create_multipart("ledger/obj")
    assert _uploads(s3_client, s3_bucket) == [("t/ledger/obj", upload_id)]
    store.abort_multipart("ledger/obj", upload_id)
    assert _uploads(s3_client, s3_bucket) == []


def test_put_file_multipart_reports_the_upload_id_first_and_leaves_no_upload(store, s3_client, s3_bucket, tmp_path):
    body = os.urandom(3 * MIN_PART_SIZE + 7)
    path = tmp_path / "big"
    path.write_bytes(body)
    seen = []

    def ledger(upload_id):
        seen.append((upload_id, _uploads(s3_client, s3_bucket)))

    etag = store.put_file("mpf/obj", path, on_multipart=ledger)
    [(upload_id, live)] = seen
    assert live == [("t/mpf/obj", upload_id)]  # the callback ran with the upload open, before parts
    assert etag.endswith("-4")  # 3 full parts + the tail: it really went multipart
    assert store.get("mpf/obj") == body
    assert _uploads(s3_client, s3_bucket) == []


def test_put_file_aborts_the_upload_when_the_ledger_callback_fails(store, s3_client, s3_bucket, tmp_path):
    path = tmp_path / "big"
    path.write_bytes(os.urandom(7 * MiB))

    def failing_ledger(upload_id):
        raise RuntimeError("ledger write failed")

    with pytest.raises(RuntimeError):
        store.put_file("mpf/fail", path, on_multipart=failing_ledger)
    assert _uploads(s3_client, s3_bucket) == []
    assert store.head("mpf/fail") is None


def test_put_file_multipart_if_none_match_loss_aborts_the_upload(store, s3_client, s3_bucket, tmp_path):
    path = tmp_path / "big"
    path.write_bytes(os.urandom(7 * MiB))
    store.put("mpf/taken", b"first")
    with pytest.raises(PreconditionFailed):
        store.put_file("mpf/taken", path, if_none_match=True)
    assert store.get("mpf/taken") == b"first"
    assert _uploads(s3_client, s3_bucket) == []


def test_put_file_multipart_refuses_if_match(store, tmp_path):
    path = tmp_path / "big"
    path.write_bytes(os.urandom(7 * MiB))
    etag = store.put("mpf/m", b"x")
    with pytest.raises(InvalidInput):
        store.put_file("mpf/m", path, if_match=etag)


def test_ranged_get_sends_a_range_not_the_whole_object(store, s3_client, s3_bucket):
    data = os.urandom(MiB)
    store.put("rng/obj", data)
    assert store.get("rng/obj", 1000, 24) == data[1000:1024]
    assert store.get("rng/obj", MiB - 5) == data[-5:]


def test_missing_key_is_object_missing_and_not_a_bucket_error(store):
    with pytest.raises(ObjectMissing, match="absent"):
        store.get("never/was")
    assert store.head("never/was") is None


# --- unreachable and silent endpoints ---------------------------------------------------------


def test_unreachable_endpoint_is_a_store_error_quickly(aws_test_env, closed_loopback_port):
    port = closed_loopback_port
    store = S3Store(
        "nokv-unreachable",
        endpoint_url=f"http://127.0.0.1:{port}",
        verify_bucket=False,
        max_attempts=2,
        connect_timeout=1,
        read_timeout=1,
        **FAST,
    )
    started = time.monotonic()
    for call in (
        lambda: store.put("k", b"v"),
        lambda: store.put("k", b"v", if_none_match=True),
        lambda: store.get("k"),
        lambda: store.head("k"),
        lambda: store.delete("k"),
        lambda: list(store.list("")),
        lambda: store.create_multipart("k"),
    ):
        with pytest.raises(StoreError) as caught:
            call()
        # Nothing was sent, so nothing can have happened: never ambiguous.
        assert not isinstance(caught.value, AmbiguousResult), caught.value
    assert time.monotonic() - started < 30
    with pytest.raises(StoreError):
        S3Store("nokv-unreachable", endpoint_url=f"http://127.0.0.1:{port}", max_attempts=1, connect_timeout=1)


def _silent_store(server, **options):
    return S3Store(
        "nokv-silent",
        endpoint_url=server.endpoint,
        verify_bucket=False,
        connect_timeout=1,
        read_timeout=0.5,
        **{**FAST, "max_attempts": 3, **options},
    )


def test_conditional_put_to_a_silent_server_is_ambiguous_after_exactly_one_attempt(silent_server):
    store = _silent_store(silent_server)
    started = time.monotonic()
    with pytest.raises(AmbiguousResult):
        store.put("k", b"v", if_none_match=True)
    assert time.monotonic() - started < 15
    # A retry could turn a lost success into a false 412, so a conditional PUT is sent once.
    assert silent_server.connections == 1


def test_plain_put_to_a_silent_server_is_ambiguous_after_bounded_retries(silent_server):
    store = _silent_store(silent_server)
    with pytest.raises(AmbiguousResult):
        store.put("k", b"v")
    assert silent_server.connections == 3


def test_multipart_create_and_complete_to_a_silent_server_are_ambiguous(silent_server):
    store = _silent_store(silent_server)
    with pytest.raises(AmbiguousResult):
        store.create_multipart("k")
    with pytest.raises(AmbiguousResult):
        store.complete_multipart("k", "some-upload", [(1, "etag")])
    assert silent_server.connections == 2


def test_read_from_a_silent_server_is_a_store_error_not_ambiguous(silent_server):
    store = _silent_store(silent_server, max_attempts=2)
    for call in (lambda: store.get("k"), lambda: store.head("k")):
        with pytest.raises(StoreError) as caught:
            call()
        assert not isinstance(caught.value, AmbiguousResult)


# --- how answers are classified (a scripted loopback server) ----------------------------------


def _scripted_store(server, **options):
    return S3Store(
        "nokv-scripted",
        endpoint_url=server.endpoint,
        verify_bucket=False,
        connect_timeout=1,
        read_timeout=5,
        **{**FAST, "max_attempts": 3, **options},
    )


@pytest.mark.parametrize(
    "status, code, error",
    [
        (400, "EntityTooLarge", StoreFull),
        (403, "QuotaExceeded", StoreFull),
        (507, "InsufficientStorage", StoreFull),
        (409, "ConditionalRequestConflict", PreconditionFailed),
        (412, "PreconditionFailed", PreconditionFailed),
        (403, "AccessDenied", StoreError),
        (404, "NoSuchBucket", StoreError),
    ],
)
def test_error_answers_map_to_typed_errors(scripted_server, status, code, error):
    scripted_server.script = [(status, code)]
    with pytest.raises(error, match=code) as caught:
        _scripted_store(scripted_server).put("k", b"v", if_none_match=True)
    assert type(caught.value) is error  # e.g. a missing bucket is not a missing object
    assert len(scripted_server.requests) == 1


def test_conditional_puts_send_the_condition_headers(scripted_server):
    store = _scripted_store(scripted_server)
    store.put("k", b"v", if_none_match=True)
    store.put("k", b"v", if_match="0123abcd")
    store.put("k", b"v")
    headers = [h for _, _, h in scripted_server.requests]
    assert headers[0].get("If-None-Match") == "*" and "If-Match" not in headers[0]
    assert headers[1].get("If-Match") == '"0123abcd"' and "If-None-Match" not in headers[1]
    assert "If-Match" not in headers[2] and "If-None-Match" not in headers[2]
    assert [p for _, p, _ in scripted_server.requests] == ["/nokv-scripted/k"] * 3


def test_slow_down_is_retried_even_for_a_conditional_put(scripted_server):
    scripted_server.script = [(503, "SlowDown"), (503, "SlowDown")]
    assert _scripted_store(scripted_server).put("k", b"v", if_none_match=True) == "0123456789abcdef0123456789abcdef"
    assert len(scripted_server.requests) == 3


def test_slow_down_until_attempts_run_out_is_a_definite_store_error(scripted_server):
    scripted_server.script = [(503, "SlowDown")] * 3
    with pytest.raises(StoreError, match="SlowDown") as caught:
        _scripted_store(scripted_server).put("k", b"v", if_none_match=True)
    assert not isinstance(caught.value, AmbiguousResult)


def test_internal_error_on_a_conditional_put_is_ambiguous_and_never_retried(scripted_server):
    scripted_server.script = [(500, "InternalError")]
    with pytest.raises(AmbiguousResult):
        _scripted_store(scripted_server).put("k", b"v", if_none_match=True)
    assert len(scripted_server.requests) == 1


def test_internal_error_on_a_plain_put_is_retried(scripted_server):
    scripted_server.script = [(500, "InternalError")]
    _scripted_store(scripted_server).put("k", b"v")
    assert len(scripted_server.requests) == 2


def test_a_definite_error_after_a_lost_attempt_is_still_ambiguous(scripted_server):
    scripted_server.script = [(500, "InternalError"), (403, "AccessDenied")]
    with pytest.raises(AmbiguousResult):
        _scripted_store(scripted_server).delete("k")


def test_complete_answered_with_an_internal_error_is_ambiguous(scripted_server):
    scripted_server.script = [(200, "InternalError")]  # S3 may fail a completion inside a 200
    with pytest.raises(AmbiguousResult):
        _scripted_store(scripted_server).complete_multipart("k", "upload-1", [(1, "etag")])
    assert len(scripted_server.requests) == 1


def test_abort_of_an_upload_the_server_no_longer_knows_succeeds(scripted_server):
    scripted_server.script = [(404, "NoSuchUpload")]
    _scripted_store(scripted_server).abort_multipart("k", "upload-1")


def test_upload_part_to_an_unknown_upload_is_object_missing(scripted_server):
    scripted_server.script = [(404, "NoSuchUpload")]
    with pytest.raises(ObjectMissing, match="upload"):
        _scripted_store(scripted_server).upload_part("k", "upload-1", 1, b"x")


def _delete_result(deleted=(), errors=()) -> bytes:
    """A DeleteObjects answer: the keys deleted, and (key, code) refused."""
    body = "".join(f"<Deleted><Key>{key}</Key></Deleted>" for key in deleted)
    body += "".join(f"<Error><Key>{k}</Key><Code>{c}</Code><Message>scripted {c}</Message></Error>" for k, c in errors)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{body}</DeleteResult>'
    ).encode()


def _keys_sent(body: bytes) -> list[str]:
    import xml.etree.ElementTree as ET

    return [element.text for element in ET.fromstring(body).iter() if element.tag.endswith("Key")]


def test_delete_many_answers_a_per_key_refusal_for_that_key_alone(scripted_server):
    scripted_server.script = [(200, None, _delete_result(deleted=["a", "c"], errors=[("b", "AccessDenied")]))]
    results = _scripted_store(scripted_server).delete_many(["a", "b", "c"])
    assert results[0] is None and results[2] is None
    assert type(results[1]) is StoreError and "AccessDenied" in str(results[1]) and "/b" in str(results[1])
    assert len(scripted_server.requests) == 1
    method, path, _ = scripted_server.requests[0]
    assert method == "POST" and path.startswith("/nokv-scripted?delete")
    assert _keys_sent(scripted_server.bodies[0]) == ["a", "b", "c"]


def test_delete_many_sends_a_key_that_failed_inside_the_server_again_alone(scripted_server):
    scripted_server.script = [
        (200, None, _delete_result(deleted=["a"], errors=[("b", "InternalError")])),
        (200, None, _delete_result(deleted=["b"])),
    ]
    assert _scripted_store(scripted_server).delete_many(["a", "b"]) == [None, None]
    assert [_keys_sent(body) for body in scripted_server.bodies] == [["a", "b"], ["b"]]


def test_delete_many_whose_key_keeps_failing_inside_the_server_is_ambiguous_for_it(scripted_server):
    scripted_server.script = [(200, None, _delete_result(deleted=["a"], errors=[("b", "InternalError")]))] + [
        (200, None, _delete_result(errors=[("b", "InternalError")]))
    ] * 2
    results = _scripted_store(scripted_server).delete_many(["a", "b"])
    assert results[0] is None and isinstance(results[1], AmbiguousResult) and "InternalError" in str(results[1])
    assert len(scripted_server.requests) == 3  # max_attempts


def test_delete_many_fails_every_key_of_a_request_refused_as_a_whole(scripted_server):
    scripted_server.script = [(403, "AccessDenied")]
    results = _scripted_store(scripted_server).delete_many(["a", "b"])
    assert all(type(r) is StoreError and "AccessDenied" in str(r) for r in results)


def test_delete_many_sends_at_most_delete_batch_keys_per_request(scripted_server):
    keys = [f"k{n}" for n in range(5)]
    scripted_server.script = [(200, None, _delete_result(deleted=keys[i : i + 2])) for i in (0, 2, 4)]
    store = _scripted_store(scripted_server)
    store.delete_batch = 2
    assert store.delete_many(keys) == [None] * 5
    assert [_keys_sent(body) for body in scripted_server.bodies] == [keys[0:2], keys[2:4], keys[4:]]


def test_delete_many_on_the_loopback_endpoint_in_several_requests(store):
    keys = [f"dm/{n}" for n in range(7)]
    store.put_many([(key, b"x") for key in keys])
    store.delete_batch = 3
    assert store.delete_many(keys + ["dm/absent"]) == [None] * 8
    assert list(store.list("dm/")) == []


# --- deadlines: an endpoint that accepts connections and never answers ----------------------------


def _blackholed_store(server, **options):
    return S3Store(
        "nokv-blackholed",
        endpoint_url=server.endpoint,
        verify_bucket=False,
        **{**FAST, "connect_timeout": 0.5, "read_timeout": 1.0, "max_attempts": 10, "deadline": 5.0, **options},
    )


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda s: s.get("k"), StoreTimeout),
        (lambda s: s.get("k", 10, 5), StoreTimeout),
        (lambda s: s.head("k"), StoreTimeout),
        (lambda s: list(s.list("p/")), StoreTimeout),
        (lambda s: s.put("k", b"v"), AmbiguousTimeout),
        (lambda s: s.put("k", b"v", if_none_match=True), AmbiguousTimeout),
        (lambda s: s.delete("k"), AmbiguousTimeout),
        (lambda s: s.create_multipart("k"), AmbiguousTimeout),
        (lambda s: s.multipart_uploads("k"), StoreTimeout),
    ],
    ids=["get", "ranged-get", "head", "list", "put", "conditional-put", "delete", "create-multipart", "list-uploads"],
)
def test_a_blackholed_endpoint_gives_a_typed_error_within_the_deadline(aws_test_env, silent_server, call, error):
    """Issue 11: "Every store call has connect/read deadlines and bounded retries" -- against a
    socket that accepts connections and never answers, each call ends with a typed error within
    its deadline (5 s here), never a hang. A read is StoreTimeout (nothing happened); a mutation
    that was sent is AmbiguousTimeout (an AmbiguousResult: its outcome is unknown, never guessed)."""
    store = _blackholed_store(silent_server)
    started = time.monotonic()
    with pytest.raises(error) as caught:
        call(store)
    elapsed = time.monotonic() - started
    assert isinstance(caught.value, StoreTimeout) and "time" in str(caught.value).lower()
    assert elapsed <= store.deadline + 1.0, elapsed
    # Retried while a whole attempt fitted (several), never beyond the deadline: not all ten.
    assert 1 <= silent_server.connections < 10


def test_delete_many_on_a_blackholed_endpoint_answers_each_key_within_the_deadline(aws_test_env, silent_server):
    store = _blackholed_store(silent_server)
    started = time.monotonic()
    results = store.delete_many(["a", "b"])
    assert time.monotonic() - started <= store.deadline + 1.0
    assert all(isinstance(r, AmbiguousTimeout) for r in results)


@pytest.mark.long
def test_the_default_deadline_bounds_a_call_to_30_seconds(aws_test_env, silent_server):
    """The defaults (connect 5 s, read 10 s, 3 attempts, 30 s deadline): a call on an endpoint
    that never answers returns StoreTimeout in at most 30 s (here: two attempts, about 20 s)."""
    store = S3Store("nokv-blackholed", endpoint_url=silent_server.endpoint, verify_bucket=False)
    assert store.deadline == 30.0
    started = time.monotonic()
    with pytest.raises(StoreTimeout):
        store.head("k")
    assert time.monotonic() - started <= 30.0 + 1.0


def test_deadline_options_are_checked(aws_test_env):
    for bad in (
        dict(deadline=0),
        dict(read_timeout=-1),
        dict(connect_timeout=20, read_timeout=20, deadline=30),
        dict(max_attempts=0),
        dict(deadline="30"),
    ):
        with pytest.raises(InvalidInput):
            S3Store("nokv-options", endpoint_url="http://127.0.0.1:9", verify_bucket=False, **bad)


def test_a_store_opened_without_waiting_still_tells_a_missing_bucket_from_a_missing_key(s3_endpoint, s3_bucket):
    """Opening with verify_bucket=False sends nothing (a mount starts while the endpoint is
    silent); the bucket is then checked at the first 404 from head, once."""
    lazy = S3Store(s3_bucket, endpoint_url=s3_endpoint, verify_bucket=False, **FAST)
    assert lazy.head("absent") is None and lazy._bucket_verified
    missing = S3Store("nokv-no-such-bucket-here", endpoint_url=s3_endpoint, verify_bucket=False, **FAST)
    with pytest.raises(StoreError, match="does not exist"):
        missing.head("k")
