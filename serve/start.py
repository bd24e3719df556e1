"""`python -m serve.start repo=<dir> [http_port=8000 grpc_port=8001 host=127.0.0.1 detach=false]`

Thin Hydra entry point around `serve.server.Server.start`: launches the wheel's tritonserver, waits until every
model is ready, prints the endpoints, then (unless detach=true) stays in the foreground and stops the server
cleanly on Ctrl-C / SIGTERM — or returns when `python -m serve.stop` ended it.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType

import hydra
from omegaconf import DictConfig

from serve.server import Server, ServerError


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@hydra.main(config_path="../conf", config_name="start", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # installed before the server starts: a SIGTERM at any moment (even while waiting for readiness) must stop
    # tritonserver rather than kill only this launcher and leave the server orphaned
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        server = Server.start(cfg.repo, host=str(cfg.host), http_port=int(cfg.http_port),
                              grpc_port=int(cfg.grpc_port), metrics_port=int(cfg.metrics_port),
                              state_dir=cfg.state_dir, timeout=float(cfg.timeout_s),
                              log_verbose=int(cfg.log_verbose), detach=bool(cfg.detach))
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Server.start already stopped what it had started
        print("interrupted while starting", file=sys.stderr)
        sys.exit(130)
    info = server.info
    print(f"tritonserver ready (pid {info.pid}): models {', '.join(info.models)}\n"
          f"  HTTP http://{info.http_url}   gRPC {info.grpc_url}   log {info.log}\n"
          f"  try: python -m serve.client --url {info.http_url} \"Guten Morgen.\"\n"
          f"  stop: python -m serve.stop repo={info.repo}", flush=True)
    if cfg.detach:
        return
    try:
        while server.alive():
            time.sleep(0.5)
        print(f"tritonserver exited (code {server.process.poll() if server.process else '?'})", flush=True)
    except KeyboardInterrupt:
        print("stopping tritonserver …", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second signal must not cut the shutdown short
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        server.stop()


if __name__ == "__main__":
    main()
