"""Train every run of a suite at once on a lent GPU machine, within a deadline, and pack the finished run dirs.

Why: a lent GPU comes for minutes, not hours. This starts all of a suite's runs at once (one CPU thread each),
sheds the lowest-priority run that cannot finish by the deadline even with the GPU to itself, stops the rest at
the deadline, and packs the finished run dirs (no checkpoints) and the runs' stderr into $OUT/runs.tar.gz, to be
recorded on the CPU machine (`python -m zoo.report +suite=<suite> stages=[train]` finds them finished).
Its runs' logs are in `results/h200/` (`*_monitor*.log`).

usage: python -m zoo.devtools.gpu_suite SUITE DEADLINE_S [zoo.report overrides...]
Priority: the suite's order of entries, then seeds; shedding drops whole entries from the end of the list first.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

T0 = time.time()
LOGS = Path("/tmp/gpu_logs")


def say(msg: str) -> None:
    print(f"[{time.time() - T0:6.0f}s] {msg}", flush=True)


def arg(cmd: list[str], key: str) -> str:
    """The value of `key=value` in a training command."""
    return next(a.split("=", 1)[1] for a in cmd if a.startswith(key + "="))


def planned_commands(suite: str, extra: list[str]) -> list[list[str]]:
    """The `-m zoo.train …` commands of the suite's runs without a record (zoo.report's dry run)."""
    plan = subprocess.run(
        [sys.executable, "-m", "zoo.report", f"+suite={suite}", "dry_run=true", *extra], capture_output=True, text=True
    )
    print(plan.stdout[-3000:], plan.stderr[-3000:], flush=True)
    return [line.split("] ", 1)[1].split() for line in plan.stdout.splitlines() if "] -m zoo.train " in line]


def entry_name(cmd: list[str]) -> str:
    """The name the run directory carries: a suite variant's `model.name=` override, else the `+model` entry
    (the monitor of 2026-11-27 globbed `ght-*` for variant `ght_summ`, saw update 0 throughout and stopped the
    GHT runs at its deadline as if they had not started)."""
    return next((a.split("=", 1)[1] for a in cmd if a.startswith("model.name=")), None) or arg(cmd, "+model")


def step_of(run: dict[str, Any]) -> int:
    """The run's last logged update (its metrics.csv), 0 before the first."""
    files = sorted(glob.glob(f"{run['root']}/{run['entry']}-*/*/metrics.csv"))
    if not files:
        return 0
    last = Path(files[-1]).read_text().strip().splitlines()[-1]
    m = re.match(r"(\d+),", last)
    return int(m.group(1)) if m else 0


def has_voted(run: dict[str, Any]) -> bool:
    """Whether a GHT-PS run has written its Voting-to-Stay report (written when the vote ends)."""
    return bool(glob.glob(f"{run['root']}/{run['entry']}-*/*/ght/votes.json"))


def projected_end(
    now: float, step: int, ref: tuple[float, int], updates: int, pending_vote: bool, share: int = 1
) -> float | None:
    """When a run is projected to end: its rate since `ref` (time, update) over the updates left, plus its test
    (≈ 40 s) and, before Voting-to-Stay, the vote (≈ 50 s more). None while the rate is unknown (a window under
    15 s, no progress in it, or training done). A GHT-PS run's rate restarts at its vote: counting the vote's pause
    into the rate and the vote again into the tail shed a run that would have finished (h200/README.md).
    `share`: the factor the rate may grow by as the others end — the monitor passes the number of runs alive, so a
    run is projected late only if it could not finish even with the whole GPU to itself: on 2026-11-30 the rate
    under a 12-way share (≈ 5.5 updates/s) shed three GHT-PS runs that trained in ≈ 4 minutes once alone."""
    t_ref, s_ref = ref
    if now - t_ref < 15 or step >= updates or step <= s_ref:
        return None
    rate = share * (step - s_ref) / (now - t_ref)
    return now + (updates - step) / rate + (90 if pending_vote else 40)


def start_runs(cmds: list[list[str]]) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = [
        {
            "entry": entry_name(cmd),
            "seed": int(arg(cmd, "trainer.seed")),
            "root": arg(cmd, "runs_root"),
            "updates": int(arg(cmd, "trainer.max_updates")),
            "cmd": cmd,
        }
        for cmd in cmds
    ]
    entries = list(dict.fromkeys(r["entry"] for r in runs))
    for r in runs:
        r["prio"] = (entries.index(r["entry"]), r["seed"])  # smaller = kept longer
        r["vote_pending"] = r["entry"].startswith("ght_ps")  # GHT-PS pauses once to vote
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for r in runs:
        r["err"] = LOGS / f"{r['entry']}-seed{r['seed']}.err"
        r["proc"] = subprocess.Popen(
            [sys.executable, *r["cmd"]], stdout=subprocess.DEVNULL, stderr=open(r["err"], "w"), env=env
        )
    say(f"started {len(runs)} runs: " + ", ".join(f"{r['entry']}/{r['seed']}" for r in runs))
    return runs


def monitor(runs: list[dict[str, Any]], deadline: float) -> None:
    """Every 15 s: log each run's update; from 100 s on, shed the lowest-priority run among those that cannot make
    the deadline even with the GPU to themselves (work lost anyway), so the others get its share. A run that could
    finish is never shed: on 2026-11-26 shedding by priority alone killed lite baselines that would have finished,
    and on 2026-11-30 projecting at the shared rate killed GHT-PS runs that would have."""
    ref: dict[int, tuple[float, int]] = {}
    ref_time = None
    last_shed = 0.0
    while True:
        now = time.time() - T0
        alive = [r for r in runs if r["proc"].poll() is None]
        steps = {id(r): step_of(r) for r in runs}
        for r in alive:
            if r["vote_pending"] and has_voted(r):
                r["vote_pending"] = False  # the fine-tuning rate starts now: the vote's pause is not in it
                if ref_time is not None:
                    ref[id(r)] = (now, steps[id(r)])
        say(" ".join(f"{r['entry']}/{r['seed']}:{steps[id(r)]}{'' if r['proc'].poll() is None else '*'}" for r in runs))
        if not alive:
            break
        if now >= deadline:
            for r in alive:
                r["proc"].kill()
                say(f"deadline: stopped {r['entry']}/{r['seed']} at update {steps[id(r)]}")
            break
        if ref_time is None and now >= 100:
            ref_time, ref = now, {id(r): (now, steps[id(r)]) for r in runs}
        elif ref_time is not None and now >= deadline / 2 and now - max(ref_time, last_shed) >= 45 and len(alive) > 1:
            # not before half the deadline: the short runs end by then and the long ones speed up
            ends = {}  # projected ends of the runs whose rate is known (a run in its voting pass or test is skipped)
            for r in alive:
                end = projected_end(now, steps[id(r)], ref[id(r)], r["updates"], r["vote_pending"], len(alive))
                if end is not None:
                    ends[id(r)] = end
            worst = max(ends.values(), default=0.0)
            say(f"projected end of the slowest run with the GPU to itself: {worst:.0f}s (deadline {deadline:.0f}s)")
            late = [r for r in alive if ends.get(id(r), 0.0) > deadline]
            if late:
                victim = max(late, key=lambda r: r["prio"])
                victim["proc"].kill()
                say(f"shed {victim['entry']}/{victim['seed']} at update {steps[id(victim)]} to speed up the others")
                last_shed = now
                ref = {id(r): (now, steps[id(r)]) for r in runs}
        time.sleep(15)


def pack(suite: str, runs: list[dict[str, Any]], out: Path) -> None:
    """Finished run dirs (without checkpoints) and each run's stderr under 4 MB into out/runs.tar.gz."""
    time.sleep(3)
    done = [d for d in glob.glob(f"reports/{suite}/runs/seed*/*/*") if Path(d, "DONE").is_file()]
    say(f"finished: {len(done)} run dirs: {done}")
    with tarfile.open(out / "runs.tar.gz", "w:gz") as tar:
        for d in done:
            tar.add(d, filter=lambda info: None if "/checkpoints" in info.name else info)
        for r in runs:
            if r["err"].stat().st_size < 4_000_000:
                tar.add(r["err"], arcname=f"errlogs/{r['err'].name}")
    say(f"wrote {out / 'runs.tar.gz'} ({(out / 'runs.tar.gz').stat().st_size / 1e6:.1f} MB)")
    for r in runs:
        if r["proc"].returncode not in (0, None, -9):
            say(f"{r['entry']}/{r['seed']} exited {r['proc'].returncode}: {r['err'].read_text()[-1500:]}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    suite, deadline, extra = args[0], float(args[1]), args[2:]
    out = Path(os.environ.get("OUT") or "/tmp/gpu_out")
    out.mkdir(parents=True, exist_ok=True)
    LOGS.mkdir(exist_ok=True)
    cmds = planned_commands(suite, extra)
    if not cmds:
        sys.exit("no runs to train")
    runs = start_runs(cmds)
    monitor(runs, deadline)
    pack(suite, runs, out)


if __name__ == "__main__":
    main()
