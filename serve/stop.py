"""`python -m serve.stop repo=<dir>` (or `state_dir=<dir>`): stop a server started by `serve.start`.

Why a command: a detached server (or one whose terminal is gone) must be stoppable by name, and the Python
backend's /dev/shm regions must go with it; without repo/state_dir it only removes stale regions of crashed
servers (owned by you, mapped by no process).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
from omegaconf import DictConfig

from serve.server import Server, read_info, state_dir_for
from serve.shm import clean_stale_shm
from serve.state_lock import held


@hydra.main(config_path="../conf", config_name="stop", version_base="1.3")
def main(cfg: DictConfig) -> None:
    state = Path(cfg.state_dir) if cfg.state_dir else state_dir_for(Path(cfg.repo)) if cfg.repo else None
    if state is not None:
        info = read_info(state)
        if info is None:
            print(f"error: no server recorded in {state} (already stopped?)", file=sys.stderr)
            sys.exit(1)
        code = Server(info).stop(float(cfg.timeout_s))  # writes the stop marker first: nothing is restarted
        pids = ", ".join(map(str, info.pids))
        print(f"stopped tritonserver pid {pids}" + ("" if code is None else f" (exit code {code})"))
        deadline = time.monotonic() + 10  # the launcher supervising it (serve.start) sees the marker and exits
        while held(state) and time.monotonic() < deadline:
            time.sleep(0.1)
    removed = clean_stale_shm()
    if removed:
        print(f"removed {len(removed)} stale shared-memory region(s): {', '.join(removed)}")


if __name__ == "__main__":
    main()
