"""nginx in front of Triton's HTTP and gRPC endpoints: the ports users reach, with request bodies capped.

Why: the bundled Triton (2.51) crashes on a request body sent as very many small `Transfer-Encoding: chunked`
chunks (CVE-2025-23310/23311, fixed only in Triton 2.59.1 / NGC 25.07, which is not on PyPI). nginx reads the
whole body first (`proxy_request_buffering on`), refuses one over `max_body_mb` (413), and forwards it with a
Content-Length, so Triton never parses a chunked body; it passes only the KServe v2 inference, metadata
(incl. model config), health and repository-index paths (everything else: 403; the index is still behind
Triton's admin key), and times out slow clients. Triton's own HTTP listener moves to an internal loopback port
that only the proxy and this machine's admin tools use. Triton's Prometheus listener is the same HTTP library, so
it moves to loopback too and a second nginx listener on the metrics port passes only `GET /metrics`.

Compressed request bodies are refused (Triton inflates `Content-Encoding: gzip` itself: a 1 MB body became 1000 MB
in its memory), and gRPC goes through nginx too (HTTP/2, `grpc_pass`): Triton 2.51 takes gRPC messages up to 2 GB
with no flag to lower it, so nginx caps each call's messages at `max_body_mb` and refuses compressed ones
(`grpc-encoding`), answering with gRPC statuses.

nginx comes from Debian's archive like the corpus tools (`apt-get download nginx` + `dpkg-deb -x` into the
user's cache, no root, no system install) unless an `nginx` binary is on PATH.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from serve import child
from serve.errors import ServeError
from zoo.data.cache import resolve_cache_dir  # the corpus tools' cache and Debian fetcher (no torch)
from zoo.data.debian import DebianArchive
from zoo.data.types import DataError

CLIENT_KEY_HEADER = "zoo-client"  # a client's own share of the per-address limits: letters, digits, . _ -, ≤ 64
CLIENT_ID_HEADER = "zoo-client-id"  # set by nginx for the gate (whatever a client sent): "<address> <key>"
WHOSE = f"address (or {CLIENT_KEY_HEADER} key)"  # what a 429 names as the client whose share is full
PROXY_DIR = "nginx"  # inside the server's state dir: config, pid, logs (body buffers: see _buffer_dir)
BUFFERS_PREFIX = "zoo-nginx-"
# KServe v2 paths a translation client needs; anything else is refused by the proxy itself
# plus the repository index, which Triton itself restricts to the admin key (clients list models with it)
ALLOWED_PATHS = (
    r"^/v2(/health/(live|ready)|/models/[^/]+(/versions/[0-9]+)?(/ready|/infer|/config)?"
    r"|/repository/index)?$"
)


class ProxyError(ServeError, RuntimeError):
    """nginx could not be found, fetched or started; the message names the cause and the fix."""


@dataclass(frozen=True)
class ProxySettings:
    """nginx's limits (serve/README.md, Security, has the table and how to raise them). Connections are cheap
    for nginx (a few kB each) and slow ones cost it nothing else, so the capacity is large and what one client
    address can hold at once is bounded instead: a flood of slow connections from one address must not deny
    everyone else, as 520 did with nginx's default 512 connections."""

    max_body_mb: float = 4.0  # larger request bodies (HTTP) and gRPC messages are refused by nginx
    max_connections: int = 4096  # nginx worker connections: clients + connections to Triton, all ports together
    per_client_requests: int = 64  # HTTP requests and gRPC calls in progress per client (more: 429): an address, or
    # an address and the `zoo-client` key its requests carry (CLIENT_KEY_HEADER), so clients that share an address
    # (all on loopback, or behind one NAT) each get their own share by sending a key
    per_address_requests: int = 1024  # … and per address over all its keys: rotating keys does not multiply a share
    header_timeout_s: int = 10  # a request's header must arrive within this, in total
    body_read_timeout_s: int = 10  # the longest pause between two reads of a request body
    send_timeout_s: int = 30  # the longest pause while the client reads the answer
    keepalive_timeout_s: int = 30  # an idle client connection is closed after this
    upstream_timeout_s: int = 300  # waiting for Triton's answer (a request within the cost budget)
    grpc: bool = True  # nginx serves the gRPC port too (Triton 2.51 has no flag bounding its gRPC messages)

    def __post_init__(self) -> None:
        if not 1 <= self.per_client_requests <= self.per_address_requests <= 65535:
            raise ProxyError(
                f"per_client_requests={self.per_client_requests}, per_address_requests={self.per_address_requests}: "
                "use 1 ≤ per_client_requests ≤ per_address_requests ≤ 65535 (nginx's limit)"
            )
        if self.max_connections < 64 or self.max_body_mb <= 0:
            raise ProxyError("max_connections must be ≥ 64 and max_body_mb > 0")
        timeouts = ("header_timeout_s", "body_read_timeout_s", "send_timeout_s", "keepalive_timeout_s")
        for key in (*timeouts, "upstream_timeout_s"):
            if getattr(self, key) < 1:
                raise ProxyError(f"{key}={getattr(self, key)}: use a whole number of seconds ≥ 1")


def nginx_binary(cache_root: Path | None = None) -> Path:
    """An nginx executable: on PATH, else extracted from Debian's `nginx` package into the cache (once)."""
    found = shutil.which("nginx")
    if found:
        return Path(found)
    root = resolve_cache_dir(cache_root) / "debian"
    try:
        binary = DebianArchive(root).package("nginx") / "root" / "usr" / "sbin" / "nginx"
    except DataError as exc:
        raise ProxyError(
            f"nginx is needed in front of Triton's HTTP port and could not be fetched ({exc}); "
            "install it (`apt-get install nginx`) or start without it: proxy=false"
        ) from exc
    if not binary.is_file():
        raise ProxyError(f"the Debian nginx package has no {binary}; install nginx, or start with proxy=false")
    return binary


def _metrics_server(host: str, metrics: tuple[int, int] | None) -> str:
    """A second listener that passes only `GET /metrics` to Triton's loopback metrics port (None: none)."""
    if metrics is None:
        return ""
    port, upstream = metrics
    return f"""
    server {{
        listen {host}:{port};
        location = /metrics {{
            limit_except GET {{ deny all; }}
            proxy_pass http://127.0.0.1:{upstream};
        }}
        location / {{
            default_type text/plain;
            return 403 'only GET /metrics is served on this port\n';
        }}
    }}"""


def _grpc_server(host: str, settings: ProxySettings, grpc: tuple[int, int] | None) -> str:
    """A listener for gRPC (HTTP/2) that passes every call to Triton's loopback gRPC port (None: none): each
    call's messages count against `client_max_body_size`, and compressed messages (`grpc-encoding` other than
    identity) are refused, as Triton would inflate them past any cap. Refusals are gRPC statuses (trailers only),
    so clients see RESOURCE_EXHAUSTED / UNIMPLEMENTED with the reason."""
    if grpc is None:
        return ""
    port, upstream = grpc
    encoded = _grpc_status(12, "compressed gRPC messages are not accepted; send them uncompressed (identity)")
    too_large = _grpc_status(8, f"gRPC message over {settings.max_body_mb:g} MB; send fewer or shorter texts")
    too_many = _grpc_status(8, f"over {settings.per_client_requests} calls in progress from your {WHOSE}; retry")
    return f"""
    upstream triton_grpc {{ server 127.0.0.1:{upstream}; keepalive 16; }}
    server {{
        listen {host}:{port} http2;
        limit_conn zoo_per_client {settings.per_client_requests};
        limit_conn zoo_per_address {settings.per_address_requests};
        grpc_connect_timeout 5s;
        grpc_read_timeout {settings.upstream_timeout_s}s;
        grpc_send_timeout {settings.upstream_timeout_s}s;
        location / {{
            if ($zoo_grpc_encoded) {{ return 415; }}
            grpc_set_header {CLIENT_ID_HEADER} "$remote_addr $zoo_client_key";
            grpc_pass grpc://triton_grpc;
        }}
        error_page 415 = @grpc_encoded;
        location @grpc_encoded {{
            {encoded}
        }}
        error_page 413 = @grpc_too_large;
        location @grpc_too_large {{
            {too_large}
        }}
        error_page 429 = @grpc_too_many;
        location @grpc_too_many {{
            {too_many}
        }}
    }}"""


def _grpc_status(code: int, message: str) -> str:
    """An nginx answer that gRPC clients read as status `code` with `message` (a trailers-only response)."""
    return (
        f'default_type application/grpc; add_header grpc-status {code} always; add_header grpc-message "{message}" '
        "always; return 204;"
    )


def nginx_config(
    state: Path,
    tmp: Path,
    host: str,
    port: int,
    upstream_port: int,
    settings: ProxySettings,
    metrics: tuple[int, int] | None = None,
    grpc: tuple[int, int] | None = None,
    log_port: int | None = None,
) -> str:
    """The proxy's nginx.conf: pid and logs in `state`, request-body buffers in `tmp`; `metrics` = (public port,
    Triton's loopback metrics port) adds the Prometheus listener, `grpc` = (public port, Triton's loopback gRPC
    port) the gRPC one. Request bodies sent compressed (`Content-Encoding`, `grpc-encoding`) are refused: Triton
    inflates them itself, and a 1 MB gzip body inflated to 1000 MB there. `log_port`: nginx's error log goes as
    syslog to the gate on that loopback UDP port, which writes it to error.log with repeated messages collapsed
    (serve/log_collapse.py; a client can make nginx log a line per request); only `crit` and worse are written
    directly."""
    limit = settings.per_client_requests
    error_log = f"error_log {state / 'error.log'} warn;"
    if log_port is not None:
        error_log = (
            f"error_log {state / 'error.log'} crit;\n"
            f"error_log syslog:server=127.0.0.1:{log_port},nohostname,tag=nginx warn;"
        )
    return f"""worker_processes 1;
worker_rlimit_nofile {2 * settings.max_connections + 64};
pid {state / "nginx.pid"};
{error_log}
events {{ worker_connections {settings.max_connections}; }}
http {{
    access_log off;
    client_body_temp_path {tmp / "body"};
    proxy_temp_path {tmp / "proxy"};
    fastcgi_temp_path {tmp / "fastcgi"};
    uwsgi_temp_path {tmp / "uwsgi"};
    scgi_temp_path {tmp / "scgi"};
    client_max_body_size {int(settings.max_body_mb * 1024 * 1024)};
    client_body_buffer_size 128k;
    client_header_timeout {settings.header_timeout_s}s;
    client_body_timeout {settings.body_read_timeout_s}s;
    send_timeout {settings.send_timeout_s}s;
    keepalive_timeout {settings.keepalive_timeout_s}s;
    reset_timedout_connection on;
    map $http_zoo_client $zoo_client_key {{ "~^[A-Za-z0-9_.-]{{1,64}}$" $http_zoo_client; default ""; }}
    limit_conn_zone $binary_remote_addr$zoo_client_key zone=zoo_per_client:8m;
    limit_conn_zone $binary_remote_addr zone=zoo_per_address:4m;
    limit_conn_status 429;
    limit_conn_log_level info;
    proxy_request_buffering on;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_set_header {CLIENT_ID_HEADER} "$remote_addr $zoo_client_key";
    proxy_connect_timeout 5s;
    proxy_read_timeout {settings.upstream_timeout_s}s;
    proxy_send_timeout {settings.upstream_timeout_s}s;
    map $http_content_encoding $zoo_encoded {{ default 1; "" 0; "~*^identity$" 0; }}
    map $http_grpc_encoding $zoo_grpc_encoded {{ default 1; "" 0; "~*^identity$" 0; }}
    upstream triton {{ server 127.0.0.1:{upstream_port}; keepalive 16; }}
    server {{
        listen {host}:{port};
        limit_conn zoo_per_client {settings.per_client_requests};
        limit_conn zoo_per_address {settings.per_address_requests};
        if ($zoo_encoded) {{ return 415; }}
        location ~ "{ALLOWED_PATHS}" {{
            limit_except GET POST {{ deny all; }}
            proxy_pass http://triton;
        }}
        location / {{
            default_type application/json;
            return 403 '{{"error":"not served on this port: only KServe v2 inference, metadata and health"}}';
        }}
        error_page 413 = @too_large;
        location @too_large {{
            default_type application/json;
            return 413 '{{"error":"request body over {settings.max_body_mb:g} MB; send fewer or shorter texts"}}';
        }}
        error_page 415 = @encoded;
        location @encoded {{
            default_type application/json;
            return 415 '{{"error":"compressed request bodies (Content-Encoding) are refused; send it uncompressed"}}';
        }}
        error_page 429 = @too_many;
        location @too_many {{
            default_type application/json;
            return 429 '{{"error":"over {limit} requests in progress from your {WHOSE}; retry later"}}';
        }}
    }}{_grpc_server(host, settings, grpc)}{_metrics_server(host, metrics)}
}}
"""


def _buffer_dir(state: Path) -> Path:
    """Where nginx's workers buffer request bodies. Started as root, nginx runs its workers as `nobody` (least
    privilege for the process that parses client input), which cannot enter a private (0700) state dir: their
    buffers then live in a fresh `/tmp/zoo-nginx-*` owned by nobody (mode 0700), removed by `stop_proxy`.
    Started as another user, the workers are that user and the buffers stay in the state dir."""
    if os.geteuid() == 0:
        tmp = Path(tempfile.mkdtemp(prefix=BUFFERS_PREFIX, dir="/tmp"))
        nobody = pwd.getpwnam("nobody")
    else:
        tmp, nobody = state / "tmp", None
    for sub in ("", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
        if nobody is not None:
            os.chown(tmp / sub, nobody.pw_uid, nobody.pw_gid)
    (state / "buffers").write_text(f"{tmp}\n")
    return tmp


def _remove_buffers(state: Path) -> None:
    record = state / "buffers"
    if record.is_file():
        tmp = Path(record.read_text().strip())
        if tmp.name.startswith(BUFFERS_PREFIX) and tmp.parent == Path("/tmp"):
            shutil.rmtree(tmp, ignore_errors=True)
        record.unlink(missing_ok=True)


def _listening(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1" if host in ("0.0.0.0", "") else host, port)) == 0


def start_proxy(
    state_dir: Path,
    host: str,
    port: int,
    upstream_port: int,
    settings: ProxySettings,
    detach: bool = False,
    timeout: float = 20.0,
    metrics: tuple[int, int] | None = None,
    grpc: tuple[int, int] | None = None,
    log_port: int | None = None,
) -> subprocess.Popen:
    """Run nginx in the foreground of a child process (it dies with `stop_proxy`); wait until it listens.
    `metrics` = (public port, Triton's loopback metrics port) also serves GET /metrics, `grpc` = (public port,
    Triton's loopback gRPC port) gRPC."""
    state = state_dir / PROXY_DIR
    state.mkdir(parents=True, exist_ok=True)
    binary = nginx_binary()
    buffers = _buffer_dir(state)
    try:
        return _launch(
            binary, state, buffers, host, port, upstream_port, settings, detach, timeout, metrics, grpc, log_port
        )
    except BaseException:
        _remove_buffers(state)
        raise


def _launch(
    binary: Path,
    state: Path,
    buffers: Path,
    host: str,
    port: int,
    upstream_port: int,
    settings: ProxySettings,
    detach: bool,
    timeout: float,
    metrics: tuple[int, int] | None,
    grpc: tuple[int, int] | None,
    log_port: int | None,
) -> subprocess.Popen:
    conf = state / "nginx.conf"
    conf.write_text(nginx_config(state, buffers, host, port, upstream_port, settings, metrics, grpc, log_port))
    cmd = [str(binary), "-p", str(state), "-c", str(conf), "-e", str(state / "error.log"), "-g", "daemon off;"]
    check = subprocess.run([*cmd, "-t"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise ProxyError(f"nginx rejected its config {conf}: {check.stderr.strip()[-500:]}")
    process = child.spawn(cmd, state / "stdout.log", detach)
    outcome = child.wait_until(
        process, lambda: _listening(host, port) and (not grpc or _listening(host, grpc[0])), timeout
    )
    if outcome == child.EXITED:
        log = (state / "error.log").read_text(errors="replace") if (state / "error.log").is_file() else ""
        raise ProxyError(
            f"nginx exited with code {process.returncode} while starting on {host}:{port}: {log.strip()[-500:]}"
        )
    if outcome == child.LATE:
        process.kill()
        raise ProxyError(f"nginx did not listen on {host}:{port} within {timeout:.0f} s (log: {state / 'error.log'})")
    return process


def stop_proxy(pid: int, state_dir: Path, timeout: float = 10.0, process: subprocess.Popen | None = None) -> None:
    """Stop nginx (SIGQUIT: finish requests in flight, then exit; SIGKILL after `timeout`); remove its buffers."""
    try:
        child.stop(pid, timeout, process, program="nginx", sig=signal.SIGQUIT)
    finally:
        _remove_buffers(state_dir / PROXY_DIR)


__all__ = ["ALLOWED_PATHS", "ProxyError", "ProxySettings", "nginx_binary", "nginx_config", "start_proxy", "stop_proxy"]
