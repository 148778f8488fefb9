"""`nokvfs mount --metrics [ADDRESS:]PORT`: the status figures in the Prometheus exposition format.

The listener is opt-in and binds to loopback unless an address is given. The exposition is
written by the Prometheus client library (prometheus_client) from the same snapshot `nokvfs
status` shows (nokvfs.fs.status.MountStatus), collected at each scrape, so the two never disagree.
Names follow Prometheus conventions: `nokvfs_` prefix, `_total` counters, seconds and bytes.
"""

from __future__ import annotations

import ipaddress
import logging

from nokvfs.errors import InvalidInput

log = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1"


def parse_listen(text: str) -> tuple[str, int]:
    """'PORT', 'ADDRESS:PORT' or '[IPv6]:PORT' -> (address, port); loopback when no address."""
    text = text.strip()
    host, _, port_text = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_ADDRESS
    try:
        port = int(port_text)
        ipaddress.ip_address(host)
    except ValueError:
        raise InvalidInput(f"--metrics wants [ADDRESS:]PORT with a numeric IP address, got {text!r}") from None
    if not 0 < port < 65536:
        raise InvalidInput(f"--metrics port {port} is out of range 1..65535")
    return host, port


def _add_meter(family, label_values: list, meter: dict) -> None:
    """One sample of a histogram family from a Meter snapshot (nokvfs.meters): its cumulative
    buckets and its sum in seconds."""
    buckets = [("+Inf" if bound == "+Inf" else repr(float(bound)), count) for bound, count in meter["buckets"]]
    family.add_metric(label_values, buckets=buckets, sum_value=meter["total_ms"] / 1000)


class StatusCollector:
    """A prometheus_client collector over MountStatus.snapshot()."""

    def __init__(self, snapshot):
        self.snapshot = snapshot

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        s = self.snapshot()
        labels = {"mountpoint": s["mountpoint"]}
        keys, values = list(labels), list(labels.values())

        def gauge(name, doc, value):
            family = GaugeMetricFamily(name, doc, labels=keys)
            family.add_metric(values, float(value))
            return family

        def counter(name, doc, value):
            family = CounterMetricFamily(name, doc, labels=keys)
            family.add_metric(values, float(value))
            return family

        info = GaugeMetricFamily(
            "nokvfs_mount_info",
            "The mount (always 1), with its data directory and mode",
            labels=keys + ["data_dir", "mode"],
        )
        info.add_metric(values + [s["data_dir"], s["mode"]], 1.0)
        yield info
        yield gauge("nokvfs_uptime_seconds", "Seconds since the daemon started", s["uptime_s"])
        yield gauge("nokvfs_resident_memory_bytes", "Resident memory of the daemon", s["rss_bytes"])
        yield gauge(
            "nokvfs_resident_anonymous_memory_bytes",
            "Resident anonymous memory (the daemon's heap)",
            s["rss_anon_bytes"],
        )
        yield gauge(
            "nokvfs_resident_file_memory_bytes",
            "Resident file-backed memory (mostly the shard's map)",
            s["rss_file_bytes"],
        )
        for kind in ("publications", "reads", "writes"):
            meter = s[kind]
            singular = kind[:-1]
            latency = HistogramMetricFamily(
                f"nokvfs_{singular}_seconds", f"Latency of {kind} (failed ones included)", labels=keys
            )
            _add_meter(latency, values, meter)
            yield latency
            failures = CounterMetricFamily(
                f"nokvfs_{singular}_failures", f"Failed {kind} by error kind", labels=keys + ["kind"]
            )
            for error, n in sorted(meter["failures"].items()):
                failures.add_metric(values + [error], float(n))
            yield failures
        store = HistogramMetricFamily(
            "nokvfs_store_call_seconds", "Latency of object store calls", labels=keys + ["call"]
        )
        store_failures = CounterMetricFamily(
            "nokvfs_store_call_failures",
            "Failed object store calls by call and error kind",
            labels=keys + ["call", "kind"],
        )
        for call, meter in sorted(s["store"].items()):
            _add_meter(store, values + [call], meter)
            for error, n in sorted(meter["failures"].items()):
                store_failures.add_metric(values + [call, error], float(n))
        yield store
        yield store_failures
        yield counter(
            "nokvfs_syscall_timeouts", "System calls answered EIO at the syscall deadline", s["syscall_timeouts"]
        )
        spools = s["spools"]
        yield gauge("nokvfs_spools_open", "Spools of files open for writing in this mount", spools["open"])
        yield gauge(
            "nokvfs_spools_kept",
            "Kept spools (unpublished bytes awaiting `nokvfs spool retry|discard`)",
            spools["kept"],
        )
        yield gauge("nokvfs_spools_kept_bytes", "Bytes in kept spools", spools["kept_bytes"])
        write_back = s.get("write_back")
        if write_back is not None:
            yield gauge(
                "nokvfs_writeback_backlog", "Files accepted at close and not published yet", write_back["backlog"]
            )
            yield counter("nokvfs_writeback_accepted", "Files accepted at close (--write-back)", write_back["accepted"])
            yield counter("nokvfs_writeback_published", "Accepted files published", write_back["published"])
            yield counter(
                "nokvfs_writeback_failed", "Accepted files whose publication failed (kept)", write_back["failed"]
            )
        cache = s["block_cache"]
        if cache is not None:
            yield gauge("nokvfs_block_cache_bytes", "Bytes in the on-disk block cache", cache["bytes"])
            yield gauge("nokvfs_block_cache_max_bytes", "Capacity of the on-disk block cache", cache["max_bytes"])
            yield counter("nokvfs_block_cache_hits", "Block cache hits", cache["hits"])
            yield counter("nokvfs_block_cache_misses", "Block cache misses", cache["misses"])
            yield counter("nokvfs_block_cache_evictions", "Blocks evicted from the cache", cache["evictions"])
        memory = s["memory_blocks"]
        yield gauge("nokvfs_memory_blocks_bytes", "Bytes of blocks kept in memory for readers", memory["bytes"])
        yield counter("nokvfs_blocks_fetched", "Blocks fetched on demand", memory["fetched"])
        yield counter("nokvfs_blocks_prefetched", "Blocks fetched ahead of readers", memory["prefetched"])
        yield counter("nokvfs_memory_block_hits", "Reads served from blocks kept in memory", memory["hits"])
        feed = s["change_feed"]
        yield gauge("nokvfs_shard_commit_version", "The shard's commit version", feed["shard_commit_version"])
        yield gauge(
            "nokvfs_change_feed_versions_behind",
            "Commit versions the mount's caches have not followed yet",
            feed["versions_behind"],
        )
        yield counter("nokvfs_change_events_followed", "Change events the mount followed", feed["events_followed"])
        replication = s["replication"]
        if replication is not None and replication.get("role") == "owner" and replication.get("started"):
            yield gauge(
                "nokvfs_replication_records_behind",
                "Outbox records not shipped to the bucket yet",
                replication["records_behind"],
            )
            if replication.get("seconds_since_push") is not None:
                yield gauge(
                    "nokvfs_replication_seconds_since_push",
                    "Seconds since the last push to the bucket",
                    replication["seconds_since_push"],
                )
        if replication is not None and replication.get("role") == "follower" and replication.get("started"):
            yield gauge(
                "nokvfs_follower_versions_behind",
                "Commit versions the bucket has that this follower has not applied",
                replication["versions_behind"],
            )
            yield gauge(
                "nokvfs_follower_seconds_behind",
                "Age of the oldest increment not applied yet",
                replication["behind_ms"] / 1000,
            )


class MetricsServer:
    """The HTTP listener of the exposition: prometheus_client's WSGI app and server class, served
    by a thread of ours. prometheus_client's own `start_http_server` serves with socketserver's
    default half-second poll, which every unmount then waited for."""

    POLL = 0.05  # seconds serve_forever waits between checks for stop()

    def __init__(self, address: str, port: int, snapshot):
        self.address, self.port = address, port
        self.snapshot = snapshot
        self._server = None
        self._thread = None

    def start(self) -> None:
        import socket
        import threading
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import CollectorRegistry, make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatusCollector(self.snapshot))
        address = ipaddress.ip_address(self.address)
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET

        class Server(ThreadingWSGIServer):
            address_family = family

        class Quiet(WSGIRequestHandler):
            def log_message(self, format, *args):
                pass  # a scrape is not an event

        self._server = make_server(self.address, self.port, make_wsgi_app(registry), Server, handler_class=Quiet)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": self.POLL}, name="nokvfs-metrics", daemon=True
        )
        self._thread.start()
        if not address.is_loopback:
            log.warning("metrics of this mount are served to the network on %s:%d", self.address, self.port)
        log.info("metrics on http://%s:%d/metrics", self.address, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()  # returns once serve_forever has seen it: within POLL
            self._server.server_close()
            self._thread.join(2.0)
