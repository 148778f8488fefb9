"""Fixtures for S3 tests: a real S3 wire endpoint on loopback (moto's server), and misbehaving
loopback servers. Nothing here ever talks to a non-loopback address.

Use from a test module with ``pytest_plugins = ["tests.s3_fixtures"]``.

The moto server runs in this process on 127.0.0.1 with dummy credentials set in the environment
(and every other AWS configuration source pointed at /dev/null) for the whole session. Requests
are serialised through one lock: moto evaluates If-None-Match / If-Match and then stores the
object in separate steps, so two concurrent conditional PUTs could both pass their checks; real
S3 decides them atomically, and the lock gives the emulator that same guarantee.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
import time
import uuid

import boto3
import pytest

_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}
_CLEARED_ENV = (
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
)


def _serialised_moto_server():
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        create_backend_app,
    )
    from moto.server import ThreadedMotoServer
    from werkzeug.serving import make_server

    class SerialisedMotoServer(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = DomainDispatcherApplication(create_backend_app)
            lock = threading.Lock()

            def serialised(environ, start_response):
                with lock:
                    return list(app(environ, start_response))

            self._server = make_server(self._ip_address, self._port, serialised, True)
            self._server_ready_event.set()
            self._server.serve_forever()

    return SerialisedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)


def _started(server) -> str:
    """Start a moto server made for 127.0.0.1; its endpoint URL."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server.start()
    host, port = server.get_host_and_port()
    assert host == "127.0.0.1"
    return f"http://{host}:{port}"


def start_loopback_moto(*, serialised: bool = True):
    """For scripts, which have no fixtures: the dummy AWS environment set for this process and a
    moto server on 127.0.0.1 (serialised like the tests' one, or moto's own threaded server);
    returns (server, endpoint). The caller stops the server."""
    from moto.server import ThreadedMotoServer

    for name in _CLEARED_ENV:
        os.environ.pop(name, None)
    os.environ.update(_TEST_ENV)
    server = (
        _serialised_moto_server() if serialised else ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    )
    return server, _started(server)


@pytest.fixture(scope="session")
def aws_test_env():
    """Dummy credentials and no real AWS configuration, restored afterwards."""
    saved = {name: os.environ.get(name) for name in (*_TEST_ENV, *_CLEARED_ENV)}
    for name in _CLEARED_ENV:
        os.environ.pop(name, None)
    os.environ.update(_TEST_ENV)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def s3_endpoint(aws_test_env):
    """``http://127.0.0.1:<port>`` of a moto S3 server running for the session."""
    server = _serialised_moto_server()
    endpoint = _started(server)
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A fresh, empty bucket with a valid DNS name."""
    name = f"nokv-test-{uuid.uuid4().hex[:20]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    yield name
    client.close()


@pytest.fixture
def s3_client(s3_endpoint):
    """A plain boto3 client on the loopback server, for looking behind a store's back."""
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")
    yield client
    client.close()


@pytest.fixture
def closed_loopback_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SilentServer:
    """Accepts TCP connections on 127.0.0.1, reads whatever arrives, never answers.

    `connections` counts accepted connections: a client opens a fresh one for every attempt
    after a timed-out one, so it counts attempts.
    """

    def __init__(self):
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self.received = bytearray()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, name="silent-s3", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([self._listener, *self._sockets], [], [], 0.05)
            for sock in readable:
                if sock is self._listener:
                    conn, _ = self._listener.accept()
                    self.connections += 1
                    self._sockets.append(conn)
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if data:
                    self.received += data
                else:
                    self._sockets.remove(sock)
                    sock.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sock in self._sockets:
            sock.close()
        self._listener.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


class ScriptedS3Server:
    """An HTTP server on 127.0.0.1 that answers each request with the next scripted response.

    A response is ``(status, error_code)``; an error code of None means success (an empty body
    with an ETag), and ``(status, None, body)`` answers with that XML body (a DeleteObjects
    result, say). When the script runs out, every request succeeds. `requests` records the
    (method, path, headers) of what arrived, so a test can count attempts and inspect headers,
    and `bodies` the request bodies.
    """

    def __init__(self, script=()):
        import http.server

        self.script = list(script)
        self.requests: list[tuple[str, str, dict]] = []
        self.bodies: list[bytes] = []
        lock = threading.Lock()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                received = self.rfile.read(length) if length else b""
                with lock:
                    server.requests.append((self.command, self.path, dict(self.headers)))
                    server.bodies.append(received)
                    status, code, *scripted = server.script.pop(0) if server.script else (200, None)
                if code is None and scripted:
                    body = scripted[0]
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                elif code is None:
                    body = b""
                    self.send_response(status)
                    self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
                else:
                    body = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                        f"<Message>scripted {code}</Message></Error>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="scripted-s3", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


@pytest.fixture
def scripted_server(aws_test_env):
    server = ScriptedS3Server()
    yield server
    server.close()


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in front of `target` ("http://127.0.0.1:PORT") that can be cut:
    `cut()` closes every connection and refuses new ones (a network partition between one
    "machine" and the bucket), `mend()` forwards again. `endpoint` is what a client uses.
    `upload_rate` (bytes/s per connection, None: unlimited) slows what a client sends: a slow
    link to the bucket, however fast the machine."""

    def __init__(self, target: str, *, upload_rate: float | None = None):
        host, port = target.removeprefix("http://").split(":")
        self._target = (host, int(port))
        self._upload_rate = upload_rate
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="cuttable-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([self._listener], [], [], 0.05)
            if not readable:
                continue
            client, _ = self._listener.accept()
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b, rate in ((client, upstream, self._upload_rate), (upstream, client, None)):
                threading.Thread(target=self._pipe, args=(a, b, rate), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, rate: float | None = None) -> None:
        try:
            while not self._cut.is_set() and (data := source.recv(65536)):
                sink.sendall(data)
                if rate is not None:
                    time.sleep(len(data) / rate)
        except OSError:
            pass
        for sock in (source, sink):
            self._close(sock)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.discard(sock)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            self._close(sock)

    def mend(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self.cut()
        self._stop.set()
        self._thread.join()
        self._listener.close()


@pytest.fixture
def cuttable_proxy(s3_endpoint):
    proxy = CuttableProxy(s3_endpoint)
    yield proxy
    proxy.close()


@contextlib.contextmanager
def slow_link(s3_endpoint: str, data_dir: str, upload_rate: float):
    """A CuttableProxy sending at most `upload_rate` bytes/s per connection to the bucket, for a
    data directory made to use it; afterwards the data directory's configuration names the
    bucket's own endpoint again (what checks it after the test reaches the bucket directly)."""
    proxy = CuttableProxy(s3_endpoint, upload_rate=upload_rate)
    try:
        yield proxy
    finally:
        proxy.close()
        config_path = os.path.join(data_dir, "nokvfs.json")
        if os.path.exists(config_path):
            with open(config_path) as f:
                config = json.load(f)
            config["endpoint_url"] = s3_endpoint
            with open(config_path, "w") as f:
                json.dump(config, f)
