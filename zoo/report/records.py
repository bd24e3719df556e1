"""Results records: the small committed files every published table is rendered from (zoo/DESIGN.md §3b').

A suite grows run by run, on whatever machine has time: each finished (entry, seed) leaves
`results/<suite>/<entry>-seed<k>.json.gz` (≈ 30 KB), and the suite's test references are stored once as
`results/<suite>/references.json.gz`. A record is self-describing — the resolved config, the suite's budget,
git sha, machine, size, FLOPs, test scores overall and per source, the test hypotheses themselves (so a paired
bootstrap against any other record can be recomputed without the runs), the learning curve and whether it had
flattened (`convergence`), GHT probes and votes (speed lives beside them, in `speed-<machine>.json`) —
so the table can be rebuilt on a fresh clone that has no run directories and no corpus.

Reading is strict: a corrupt file, a record of another suite or budget, hypotheses that do not align with the
stored references, or a machine class not comparable with the other records' (a GPU's beside CPUs; any CPU
models may share a table) stops the render with a one-line
error naming the file and the fix. Writing never replaces an existing file silently.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from omegaconf import OmegaConf

from zoo.errors import ZooError
from zoo.machine import describe_machine, quality_class
from zoo.report.suite import Suite

RECORD_FORMAT = 1
REFERENCES_FILE = "references.json.gz"
BASELINES_FILE = "baselines.json.gz"  # a summarization suite's constant and lead-k outputs (zoo/report/baselines.py)
RECORD_NAME = re.compile(r"^(?P<entry>[A-Za-z0-9_]+)-seed(?P<seed>\d+)\.json\.gz$")
# The parts of a suite that define "the same budget": records made under other values are another experiment.
BUDGET_KEYS = ("task", "data", "size", "trainer", "experiment", "overrides")
# A record's convergence summary: the validation gain over this last fraction of its updates (`last20_gain`) …
LAST_FRACTION = 0.2
# … and how far the validation loss fell over this last fraction (`last25_loss_fall`, nats per target token)
LOSS_FRACTION = 0.25


class Convergence(TypedDict):
    """Had the run stopped climbing (`convergence`)?"""

    last20_gain: float  # validation quality gained over the last LAST_FRACTION of its updates
    best_at_last: bool  # its best validation quality was its last
    last25_loss_fall: float | None  # validation loss fallen over the last LOSS_FRACTION (nats per target token)


class _RecordKeys(TypedDict):
    """The keys every record of RECORD_FORMAT has: `read_record` refuses a file that lacks one."""

    record_format: int
    suite: str
    entry: str
    seed: int
    budget: dict[str, Any]  # budget_of(suite) when it was written
    config: dict[str, Any]  # the run's resolved model, trainer, data and generation config
    git_sha: str
    machine: dict[str, Any]  # zoo.machine.describe_machine
    updates: int
    train_minutes: float
    size: dict[str, Any]  # parameters and FLOPs (zoo.flops)
    test: dict[str, Any]  # test scores, overall and per data source
    hypotheses: list[str]  # the test outputs, aligned with the suite's references
    references_sha256: str


class Record(_RecordKeys, total=False):
    """One finished run as results/<suite>/<entry>-seed<k>.json.gz stores it (schema version RECORD_FORMAT): read and
    written only in this module; older records may lack these keys."""

    stop_reason: str | None
    pruned_size: dict[str, Any] | None  # after Voting-to-Stay
    head_plan: dict[str, list[int]] | None  # the heads each attention module keeps
    learning_curve: list[dict[str, float | int | None]]  # metrics.csv's validation points
    convergence: Convergence | None
    ght: dict[str, Any] | None  # compactness probes and the Voting-to-Stay report
    speed: None  # format 1 keeps the key; speed is stored in speed-<machine>.json
    shared_from: str  # `<suite dir>/<file>` of a record adopted from a sibling suite


REQUIRED_KEYS = tuple(_RecordKeys.__annotations__)


class RecordError(ZooError, ValueError):
    """A results file that cannot be used as it is; the message names the file and the fix."""


@dataclass(frozen=True)
class References:
    """The suite's test references, one data-source label each, and their digest."""

    texts: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def sha256(self) -> str:
        return references_sha256(self.texts)


def references_sha256(texts: tuple[str, ...] | list[str]) -> str:
    """Digest of the reference list (JSON-encoded, so a newline inside a segment cannot shift the alignment)."""
    return hashlib.sha256(json.dumps(list(texts), ensure_ascii=False).encode("utf-8")).hexdigest()


def budget_of(suite: Suite) -> dict[str, Any]:
    return {
        "task": suite.task,
        "data": suite.data,
        "size": suite.size,
        "trainer": suite.trainer,
        "experiment": suite.experiment,
        "overrides": list(suite.overrides),
    }


def record_path(results_dir: Path, entry: str, seed: int) -> Path:
    return results_dir / f"{entry}-seed{seed}.json.gz"


# ---------------------------------------------------------------------------------------------- file I/O
def write_json_gz(path: Path, obj: Any, overwrite: bool = False) -> Path:
    """Write `obj` as gzip'd JSON atomically (temp file + rename: an interrupted write leaves no half file).
    Bytes are reproducible (gzip mtime 0, sorted keys) so re-writing identical content shows no git diff."""
    if path.exists() and not overwrite:
        raise RecordError(f"{path} already exists; delete it first if it should be replaced")
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(obj, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would surprise whoever reads a shared checkout
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json_gz(path: Path) -> Any:
    try:
        with gzip.open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(
            f"{path}: not a readable results file ({type(exc).__name__}: {exc}); it is corrupt or "
            f"truncated — restore it with `git checkout -- {path}`, or delete it and rerun the "
            "suite's zoo.report command to measure it again"
        ) from exc


# ---------------------------------------------------------------------------------------------- references
def references_from_run(run_dir: Path) -> References:
    """The test references and source labels of a run's data config (rebuilt from the corpus cache)."""
    from zoo.data import build_splits  # the corpus builders: only needed when a record is written

    test = build_splits(OmegaConf.load(run_dir / "config.yaml").data).test
    return References(tuple(e.tgt for e in test), tuple(e.origin for e in test))


def load_references(results_dir: Path, suite: Suite) -> References:
    path = results_dir / REFERENCES_FILE
    if not path.is_file():
        raise RecordError(
            f"{path} is missing: the records of suite {suite.name!r} cannot be scored without it; "
            f"restore it with `git checkout -- {path}`"
        )
    raw = read_json_gz(path)
    if not isinstance(raw, dict) or not {"suite", "references", "sources", "sha256"} <= raw.keys():
        raise RecordError(f"{path}: not a references file (needs suite, references, sources, sha256)")
    if raw["suite"] != suite.name:
        raise RecordError(
            f"{path}: references of suite {raw['suite']!r}, not {suite.name!r}; move it to results/{raw['suite']}/"
        )
    refs = References(tuple(raw["references"]), tuple(raw["sources"]))
    if len(refs.texts) != len(refs.sources) or refs.sha256 != raw["sha256"]:
        raise RecordError(
            f"{path}: its references do not match its own sha256/source labels (edited by hand?); "
            f"restore it with `git checkout -- {path}`"
        )
    return refs


def store_references(results_dir: Path, suite: Suite, refs: References) -> Path:
    """Write the suite's references once; refuse a different reference set (the test split changed)."""
    path = results_dir / REFERENCES_FILE
    if path.is_file():
        stored = load_references(results_dir, suite)
        if stored.sha256 != refs.sha256:
            raise RecordError(
                f"{path}: the stored test references (sha256 {stored.sha256[:12]}…, {len(stored.texts)} segments) "
                f"differ from this run's ({refs.sha256[:12]}…, {len(refs.texts)} segments): the test split changed, "
                "so its records cannot share a table with the stored ones; use another results_dir, or delete "
                f"{path.parent} to start the suite's records afresh"
            )
        return path
    return write_json_gz(
        path,
        {
            "record_format": RECORD_FORMAT,
            "suite": suite.name,
            "sha256": refs.sha256,
            "references": list(refs.texts),
            "sources": list(refs.sources),
        },
    )


# ---------------------------------------------------------------------------------------------- writing
def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _learning_curve(run_dir: Path) -> list[dict[str, float | int | None]]:
    """Validation points of metrics.csv (the learning-curve plot needs nothing else)."""
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []

    def num(value: str | None) -> float | None:
        return float(value) if value not in (None, "") else None

    with path.open(newline="") as f:
        return [
            {
                "step": int(r["step"]),
                "train_loss": num(r.get("train_loss")),
                "valid_loss": num(r.get("valid_loss")),
                "valid_quality": num(r.get("valid_quality")),
                "valid_distinct": num(r.get("valid_distinct")),
            }
            for r in csv.DictReader(f)
            if r.get("valid_quality") not in (None, "")
        ]


def _at(points: list[tuple[int, float]], fraction: float) -> tuple[float, float]:
    """(value at (1 − fraction) × the last step, interpolated linearly between points — the first point's where
    none comes earlier; the last value)."""
    last_step, last = points[-1]
    at = last_step * (1 - fraction)
    before = [(s, v) for s, v in points if s <= at] or points[:1]
    after = next((s, v) for s, v in points if s >= at)
    (s0, v0), (s1, v1) = before[-1], after
    return (v0 if s1 == s0 else v0 + (v1 - v0) * (at - s0) / (s1 - s0)), last


def convergence(curve: list[dict[str, Any]], fraction: float = LAST_FRACTION) -> Convergence | None:
    """Had the run stopped climbing? The validation-quality gain over its last `fraction` of updates, whether its
    best validation was its last, and how far its validation loss fell over its last LOSS_FRACTION (None where
    the curve has no losses) — the quality reads a small greedy sample, the loss the whole validation split, so a
    run whose sampled quality stalled may still be learning. None without two validation points."""
    points = [(int(p["step"]), float(p["valid_quality"])) for p in curve if p.get("valid_quality") is not None]
    if len(points) < 2:
        return None
    then, last = _at(points, fraction)
    losses = [(int(p["step"]), float(p["valid_loss"])) for p in curve if p.get("valid_loss") is not None]
    fall = None
    if len(losses) >= 2:
        before, after = _at(losses, LOSS_FRACTION)
        fall = round(before - after, 3)
    return {
        "last20_gain": round(last - then, 2),
        "best_at_last": last >= max(q for _, q in points),
        "last25_loss_fall": fall,
    }


def _ght(run_dir: Path) -> dict[str, Any] | None:
    """GHT's compactness probes (every one) and the Voting-to-Stay report, when the run has them."""
    path = run_dir / "ght" / "compactness.jsonl"
    probes = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    votes = _read_json(run_dir / "ght" / "votes.json")
    if not probes and votes is None:
        return None
    return {"probes": probes, "voting": votes}


def record_from_run(run_dir: Path, suite: Suite, entry: str, seed: int, refs: References) -> Record:
    """The record of one finished run (DONE + summary.json + test_hypotheses.txt)."""
    summary = _read_json(run_dir / "summary.json")
    hyps_path = run_dir / "test_hypotheses.txt"
    if summary is None or not summary.get("test") or not hyps_path.is_file():
        raise RecordError(
            f"{run_dir}: no summary.json with test scores or no test_hypotheses.txt; a suite run "
            "must train with evaluate_test=true (the default)"
        )
    hypotheses = hyps_path.read_text(encoding="utf-8").split("\n")[:-1]
    if len(hypotheses) != len(refs.texts):
        raise RecordError(f"{run_dir}: {len(hypotheses)} test hypotheses for {len(refs.texts)} references")
    config = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=True)
    assert isinstance(config, dict)
    machine = _read_json(run_dir / "machine.json") or {
        **describe_machine(config.get("device")),
        "note": "described when the record was written",
    }
    sha = (run_dir / "git_sha.txt").read_text().strip() if (run_dir / "git_sha.txt").is_file() else "unknown"
    curve = _learning_curve(run_dir)
    return {
        "record_format": RECORD_FORMAT,
        "suite": suite.name,
        "entry": entry,
        "seed": seed,
        "budget": budget_of(suite),
        "config": {k: config.get(k) for k in ("model", "trainer", "data", "generation")},
        "git_sha": sha,
        "machine": machine,
        "updates": summary.get("updates"),
        "train_minutes": summary.get("train_minutes"),
        "stop_reason": summary.get("stop_reason"),
        "size": summary.get("size"),
        "pruned_size": summary.get("pruned_size"),
        "head_plan": summary.get("head_plan"),
        "test": summary["test"],
        "hypotheses": hypotheses,
        "references_sha256": refs.sha256,
        "learning_curve": curve,
        "convergence": convergence(curve),
        "ght": _ght(run_dir),
        "speed": None,  # record format 1 keeps the key; speed is stored in speed-<machine>.json
    }


def write_record_from_run(results_dir: Path, suite: Suite, entry: str, seed: int, run_dir: Path) -> Path:
    """Store the suite's references (first time) and the run's record; returns the record's path."""
    refs = references_from_run(run_dir)
    store_references(results_dir, suite, refs)
    return write_json_gz(record_path(results_dir, entry, seed), record_from_run(run_dir, suite, entry, seed, refs))


# ---------------------------------------------------------------------------------------------- reading
def read_record(path: Path, suite: Suite, refs: References) -> Record:
    """One record, checked against its file name, the suite, the suite's budget and the stored references."""
    match = RECORD_NAME.match(path.name)
    if match is None:
        raise RecordError(f"{path}: not a record name (<entry>-seed<k>.json.gz); move it out of {path.parent}")
    rec = read_json_gz(path)
    if not isinstance(rec, dict):
        raise RecordError(f"{path}: not a record (a JSON object is expected); delete it and rerun the suite")
    if rec.get("record_format") != RECORD_FORMAT:
        raise RecordError(
            f"{path}: record_format {rec.get('record_format')!r}, this code reads {RECORD_FORMAT}; "
            "check out the code that wrote it, or rerun the suite to write it again"
        )
    missing = [k for k in REQUIRED_KEYS if k not in rec]
    if missing:
        raise RecordError(
            f"{path}: record lacks {', '.join(missing)} (truncated or hand-made); delete it and "
            "rerun the suite's zoo.report command to measure it again"
        )
    if rec["suite"] != suite.name:
        raise RecordError(
            f"{path}: a record of suite {rec['suite']!r}, not {suite.name!r}; move it to results/{rec['suite']}/"
        )
    if (rec["entry"], int(rec["seed"])) != (match["entry"], int(match["seed"])):
        raise RecordError(
            f"{path}: holds {rec['entry']} seed {rec['seed']}; rename it to {rec['entry']}-seed{rec['seed']}.json.gz"
        )
    budget = budget_of(suite)
    changed = [k for k in BUDGET_KEYS if rec["budget"].get(k) != budget[k]]
    if changed:
        diff = "; ".join(f"{k}: record {rec['budget'].get(k)!r}, suite {budget[k]!r}" for k in changed)
        raise RecordError(
            f"{path}: measured under another budget than suite {suite.name!r} ({diff}); keep such "
            "records in their own results_dir, or delete it to retrain under the suite's budget"
        )
    if rec["references_sha256"] != refs.sha256 or len(rec["hypotheses"]) != len(refs.texts):
        raise RecordError(
            f"{path}: its hypotheses align with references sha256 {rec['references_sha256'][:12]}… "
            f"({len(rec['hypotheses'])} segments), the suite's {REFERENCES_FILE} has "
            f"{refs.sha256[:12]}… ({len(refs.texts)}); the test split changed — delete the record to "
            "retrain it, or restore the matching references"
        )
    return rec


def record_files(results_dir: Path) -> list[Path]:
    return sorted(p for p in results_dir.glob("*.json.gz") if p.name not in (REFERENCES_FILE, BASELINES_FILE))


def load_records(results_dir: Path, suite: Suite) -> tuple[References, dict[tuple[str, int], Record]]:
    """Every record of the suite's results dir, validated; one quality class (`zoo.machine.quality_class`)."""
    files = record_files(results_dir)
    if not files:
        raise RecordError(
            f"{results_dir} holds no records; train the suite first: python -m zoo.report +suite={suite.name}"
        )
    refs = load_references(results_dir, suite)
    records: dict[tuple[str, int], Record] = {}
    first: tuple[Path, str] | None = None
    for path in files:
        rec = read_record(path, suite, refs)
        machine_class = quality_class(str(rec["machine"].get("class", "unknown")))
        if first is None:
            first = (path, machine_class)
        elif machine_class != first[1]:
            raise RecordError(
                f"{path}: measured on {machine_class}, but {first[0].name} on {first[1]}; records "
                "from different machine classes are never mixed in one table — move it to its own "
                f"results_dir (e.g. results/{suite.name}-gpu/)"
            )
        records[(rec["entry"], int(rec["seed"]))] = rec
    return refs, records


def missing_records(results_dir: Path, suite: Suite) -> list[tuple[str, int]]:
    """(entry, seed) pairs of the suite with no record yet, seeds outermost (one complete seed first)."""
    return [(e, s) for s in suite.seeds for e in suite.entries if not record_path(results_dir, e, s).is_file()]


def shared_record(results_dir: Path, suite: Suite, entry: str, seed: int) -> Path | None:
    """A record of the same (entry, seed) in a sibling suite's results dir measured under the same budget
    and the same test references — the same run, so it is shared rather than trained twice (the `ght` suite
    repeats `quick`'s transformer, ght and ght_ps). Records of another machine class than the ones already
    in `results_dir` (by `zoo.machine.quality_class`) are never shared into it."""
    present = record_files(results_dir) if results_dir.is_dir() else []
    machine_class = quality_class(str(read_json_gz(present[0]).get("machine", {}).get("class"))) if present else None
    budget = budget_of(suite)
    for candidate in sorted(results_dir.parent.glob(f"*/{entry}-seed{seed}.json.gz")):
        if candidate.parent.resolve() == results_dir.resolve():
            continue
        try:
            rec = read_json_gz(candidate)
            refs = read_json_gz(candidate.parent / REFERENCES_FILE)
        except (RecordError, OSError, ValueError):
            continue  # an unreadable sibling is its own suite's problem, reported when that suite renders
        if (
            isinstance(rec, dict)
            and rec.get("record_format") == RECORD_FORMAT
            and rec.get("budget") == budget
            and rec.get("entry") == entry
            and rec.get("seed") == seed
            and rec.get("references_sha256") == refs.get("sha256")
            and (machine_class is None or quality_class(str(rec.get("machine", {}).get("class"))) == machine_class)
        ):
            return candidate
    return None


def sibling_records(results_dir: Path, suite: Suite) -> dict[tuple[str, str, int], Record]:
    """The records of the other suites' results dirs measured under this suite's budget, keyed (dir, entry, seed):
    what they measured of the shared setting (e.g. how many batches an epoch has) holds here too. A sibling file
    that does not read is skipped — its own suite's render reports it."""
    budget, found = budget_of(suite), {}
    for path in sorted(results_dir.parent.glob("*/*.json.gz")):
        if path.parent.resolve() == results_dir.resolve() or path.name in (REFERENCES_FILE, BASELINES_FILE):
            continue
        try:
            rec = read_json_gz(path)
        except RecordError:
            continue
        if isinstance(rec, dict) and rec.get("budget") == budget and "entry" in rec and "seed" in rec:
            found[(path.parent.name, str(rec["entry"]), int(rec["seed"]))] = rec
    return found


def adopt_shared_record(source: Path, results_dir: Path, suite: Suite) -> Path:
    """Copy a sibling suite's record (and, the first time, its references) into this suite's results dir;
    the copy names where it came from (`shared_from`), everything measured stays as it was."""
    raw = read_json_gz(source.parent / REFERENCES_FILE)
    store_references(results_dir, suite, References(tuple(raw["references"]), tuple(raw["sources"])))
    rec = read_json_gz(source)
    rec.update(suite=suite.name, shared_from=f"{source.parent.name}/{source.name}")
    return write_json_gz(results_dir / source.name, rec)


__all__ = [
    "LAST_FRACTION",
    "RECORD_FORMAT",
    "Convergence",
    "Record",
    "RecordError",
    "References",
    "adopt_shared_record",
    "convergence",
    "load_records",
    "load_references",
    "missing_records",
    "read_record",
    "record_files",
    "record_from_run",
    "record_path",
    "shared_record",
    "sibling_records",
    "store_references",
    "write_json_gz",
    "write_record_from_run",
]
