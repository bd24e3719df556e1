"""`python -m serve.start repo=<dir> [http_port=8000 grpc_port=8001 host=127.0.0.1 detach=false]`

Thin Hydra entry point around `serve.server.Server.start` (conf/start.yaml → ServerSettings): launches the
wheel's tritonserver, waits until every model is ready, prints the endpoints, then stays in the foreground
supervising it (serve/supervisor.py: a crashed tritonserver is restarted, logs are bounded) and stops the server
cleanly on Ctrl-C / SIGTERM — or returns when `python -m serve.stop` ended it. `detach=true` runs exactly that
foreground launcher in the background (its own session, output in `<state>/launcher.log`) and returns once it
reports ready, so a detached server is supervised too.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

import hydra
from omegaconf import DictConfig

from serve import child
from serve.errors import ServeError, ServerError
from serve.launch import ADMIN_HEADER, RESTRICTED_APIS
from serve.proxy import ProxySettings
from serve.server import Server, state_dir_for
from serve.server_settings import ServerSettings
from zoo.errors import one_line_errors


def settings_from(cfg: DictConfig) -> ServerSettings:
    """conf/start.yaml's keys as ServerSettings (its names are the command line's: timeout_s, restrict_apis, and
    proxy + the nginx keys of `proxy_settings`)."""
    return ServerSettings(
        host=str(cfg.host),
        http_port=int(cfg.http_port),
        grpc_port=int(cfg.grpc_port),
        metrics_port=int(cfg.metrics_port),
        state_dir=cfg.state_dir,
        timeout=float(cfg.timeout_s),
        log_verbose=int(cfg.log_verbose),
        detach=False,  # detach=true runs this launcher in the background instead (run_in_background)
        restrict=bool(cfg.restrict_apis),
        proxy=proxy_settings(cfg) if cfg.proxy else None,
        metrics=bool(cfg.metrics),
        replicas=None if cfg.replicas is None else int(cfg.replicas),
    )


def proxy_settings(cfg: DictConfig) -> ProxySettings:
    """conf/start.yaml's nginx keys (serve/README.md, Security: the limits and how to raise them)."""
    return ProxySettings(
        max_body_mb=float(cfg.max_body_mb),
        grpc=bool(cfg.proxy_grpc),
        max_connections=int(cfg.max_connections),
        per_client_requests=int(cfg.per_client_requests),
        per_address_requests=int(cfg.per_address_requests),
        header_timeout_s=int(cfg.header_timeout_s),
        body_read_timeout_s=int(cfg.body_read_timeout_s),
    )


READY = "tritonserver ready"
LAUNCHER_LOG = "launcher.log"


def run_in_background(cfg: DictConfig, argv: list[str]) -> None:
    """Start this command with detach=false in its own session (it survives this terminal and keeps
    supervising the server), wait until it prints READY, echo what it printed, return. A launcher that fails
    is a ServerError with its message."""
    state = Path(cfg.state_dir).resolve() if cfg.state_dir else state_dir_for(Path(cfg.repo))
    state.mkdir(parents=True, exist_ok=True)
    log = state / LAUNCHER_LOG
    log.write_bytes(b"")  # this launch's output only: an earlier launcher's READY must not count
    args = [a for a in argv if not a.startswith(("detach=", "+detach=", "++detach="))]
    launcher = child.spawn([sys.executable, "-m", "serve.start", *args, "detach=false"], log, detach=True)
    outcome = child.wait_until(
        launcher, lambda: READY in log.read_text(errors="replace"), cfg.timeout_s + 60, every=0.2
    )
    text = log.read_text(errors="replace")
    if outcome == child.READY or READY in text:
        print(text.rstrip() + f"\n  supervised by pid {launcher.pid} (output: {log})", flush=True)
        return
    if outcome == child.EXITED:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        raise ServerError(lines[-1].removeprefix("error: ") if lines else f"serve.start exited ({log})")
    raise ServerError(f"the background serve.start (pid {launcher.pid}) did not report ready; see {log}")


@hydra.main(config_path="../conf", config_name="start", version_base="1.3")
def main(cfg: DictConfig) -> None:
    if cfg.detach:
        with one_line_errors(ServeError):
            run_in_background(cfg, sys.argv[1:])
        return
    # The handlers only set a flag (raising from a handler could land between two statements and orphan the
    # server); they are installed before launching, so a SIGTERM/SIGINT at any moment ends in a clean stop.
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    with one_line_errors(ServeError, status=lambda: 130 if stop.is_set() else 2):
        server = Server.start(cfg.repo, settings_from(cfg), cancelled=stop.is_set)
    info = server.info
    admin = (
        f"  admin APIs ({', '.join(RESTRICTED_APIS)}) need header {ADMIN_HEADER}: key in {info.admin_key_file}"
        if info.admin_key_file
        else "  admin APIs are NOT restricted (restrict_apis=false)"
    )
    print(
        f"{READY} (tritonserver pid {', '.join(map(str, info.pids))}, supervised by pid {os.getpid()}): "
        f"models {', '.join(info.models)}\n"
        f"  HTTP http://{info.http_url}   gRPC {info.grpc_url}   log {info.log}\n"
        + (f"  metrics http://{info.metrics_url}/metrics\n" if info.metrics else "")
        + f"{admin}\n"
        f'  try: python -m serve.client --url {info.http_url} --model {info.models[0]} "Guten Morgen."\n'
        f"  stop: python -m serve.stop repo={info.repo}",
        flush=True,
    )
    while not server.finished() and not stop.wait(0.5):
        pass
    if stop.is_set():
        print("stopping tritonserver …", flush=True)
    code = server.stop()
    if not stop.is_set():
        print(f"tritonserver stopped by serve.stop (exit code {code})", flush=True)


if __name__ == "__main__":
    main()
