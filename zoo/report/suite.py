"""A suite: which entries, on which data, under which budget, with which seeds (conf/suite/*.yaml).

Besides the entries of conf/model/, a suite may name *variants* — an entry plus model overrides (or another
training precision or lr schedule), recorded under their own name (a head-count sweep: `transformer_4head =
transformer + model.num_heads=4`; `transformer_bf16 = transformer + trainer.precision=bf16`) — and
*claims*: one line per paper claim with the pair of runs that tests it and the sentence of the paper that makes
it (`source`), rendered with a measured verdict (zoo/report/claims.py); `paper: ours` marks a question of this
project, which gets its own table and quotes nothing.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from export.runtime.search import Search
from zoo.errors import ZooError
from zoo.report.second_look import SecondLook, second_look_from

TASK_METRICS = {"translation": ("bleu", "chrf"), "summarization": ("rouge1", "rouge2", "rougeL")}
VARIANT_NAME = re.compile(r"^[A-Za-z0-9_]+$")  # a variant names run dirs and record files
# What a variant may change: the model, the number format training computes in, or the learning-rate schedule
# (its shape or its peak: a recipe's question, as in the `schedule` and `first_model` suites). Everything else a
# trainer.* key sets (updates, batch, time) is the suite's budget, the same for every run the suite compares.
VARIANT_KEYS = ("model.", "trainer.precision=", "trainer.lr_schedule=", "trainer.lr=")
# What a claim says of its system against its baseline (zoo/report/claims.py turns each into a region for Δ):
# better, worse, match (equal within ±margin), not_worse ("comparable or better": above −margin) and not_better
# ("does not improve": below +margin). The last three need a margin: the claim's `margin` or the suite's
# `equivalence_margin`, in the headline metric's points.
EXPECTATIONS = ("better", "worse", "match", "not_worse", "not_better")
MARGIN_EXPECTATIONS = ("match", "not_worse", "not_better")
OURS = "ours"  # `paper: ours`: a question of this project, not a paper's claim — its own table, no quote needed
CLAIM_KEYS = ("paper", "claim", "design", "system", "baseline", "expect")
SOURCE_KEYS = ("paper", "where", "quote")
DEFAULT_SEARCH = Search()  # a speed setting without max_len_a/b bounds its outputs as every search does by default


class SuiteError(ZooError, ValueError):
    """A suite file that cannot be run as written."""


@dataclass(frozen=True)
class SpeedSetting:
    name: str
    beam_size: int
    batch: int
    max_len_a: float
    max_len_b: int


@dataclass(frozen=True)
class Variant:
    """A sweep point: `entry` trained with `overrides` (model.* keys, trainer.precision / lr_schedule), recorded
    under `name`; an uptrained one starts from the finished run of `init_from` (an entry of the suite, the same seed)
    and trains `updates` more (e.g. GQA from a trained transformer, its key/value heads mean-pooled); a GHT-PS one
    with `branch_from` goes on from that GHT entry's run of the same seed at its vote where this machine has it
    (zoo/ght/branch.py: the same run as from scratch, which it is trained as otherwise)."""

    name: str
    entry: str
    overrides: tuple[str, ...]
    init_from: str | None = None
    updates: int | None = None
    branch_from: str | None = None


@dataclass(frozen=True)
class Source:
    """Where a paper makes a claim: the paper, its table/figure/section, and the sentence quoted verbatim."""

    paper: str
    where: str
    quote: str


@dataclass(frozen=True)
class Claim:
    """One paper claim (or one question of ours) and the paired comparison of this suite that tests it."""

    paper: str
    claim: str
    design: str  # equal parameters / equal FLOPs / equal budget, in words
    system: str
    baseline: str
    expect: str  # one of EXPECTATIONS
    source: Source | None = None  # required unless paper is OURS
    margin: float | None = None  # for MARGIN_EXPECTATIONS: the claim's own or the suite's equivalence_margin
    # written after the suite's records were in (`post_hoc: true`): a Holm family of its own, so adding it cannot
    # change a verdict of the claims declared before the runs
    post_hoc: bool = False

    @property
    def ours(self) -> bool:
        return self.paper == OURS


@dataclass(frozen=True)
class SpeedClaim:
    """A paper's efficiency claim ("system decodes faster than baseline"), or a question of ours (`paper: ours`, no
    source), judged at one speed point (`<setting>/<fp32|int8>` or `served`) from the per-round ratios."""

    paper: str
    claim: str
    system: str
    baseline: str
    point: str
    source: Source | None


@dataclass(frozen=True)
class SpeedControl:
    """A negative control of the speed measurement: two entries whose decoding work is the same by construction
    (`ght` has the transformer's exact shapes; only the weights differ), so their ratio must stay within the
    speed rule's margin at every point (`points`: the listed ones, None: every measured point)."""

    system: str
    baseline: str
    why: str
    points: tuple[str, ...] | None = None


@dataclass(frozen=True)
class CompactionScan:
    """One axis of a compaction scan: `entries` from the weakest constraint to the strongest, and the `reference`
    run (×1) whose validation quality a chosen setting may not lose more than the rule allows against."""

    name: str
    reference: str
    entries: tuple[str, ...]


@dataclass(frozen=True)
class CompactionRule:
    """How a compaction scan picks its setting (issue 62): the weakest one whose trained groups end with a mean
    silhouette ≥ `silhouette`, without collapse (mean intra-group cos ≥ `collapse_intra` with inter-group cos
    ≤ `collapse_inter`: every module's heads on two antipodal directions) and with a final validation quality at
    most `max_quality_loss` below the reference's."""

    silhouette: float
    collapse_intra: float
    collapse_inter: float
    max_quality_loss: float
    scans: tuple[CompactionScan, ...]


@dataclass(frozen=True)
class BudgetProbe:
    """How a budget probe picks the budget its suite is re-run at (issue 64): the smallest of `budgets` at which the
    baseline's validation quality at the next budget is less than `min_gain` higher and at least `min_distinct` of
    the validation outputs are distinct; else the last. A budget's point is the last validation at or before it (a
    run that validates every 250 updates has none at 2400)."""

    budgets: tuple[int, ...]
    min_gain: float
    min_distinct: float


@dataclass(frozen=True)
class Suite:
    name: str
    task: str
    data: str
    size: str | None
    trainer: str | None
    experiment: str | None
    seeds: tuple[int, ...]
    baseline: str
    entries: tuple[str, ...]
    overrides: tuple[str, ...] = ()
    speed_enabled: bool = True
    speed_seed: int = 1
    speed_sentences: int = 512
    speed_threads: int | None = None
    speed_rounds: int = 5
    speed_settings: tuple[SpeedSetting, ...] = field(default_factory=tuple)
    triton: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, Variant] = field(default_factory=dict)
    claims: tuple[Claim, ...] = ()
    speed_claims: tuple[SpeedClaim, ...] = ()
    speed_controls: tuple[SpeedControl, ...] = ()
    equivalence_margin: float | None = None
    compaction: CompactionRule | None = None
    probe: BudgetProbe | None = None
    second_look: SecondLook | None = None  # declared before its seeds run (zoo/report/second_look.py)

    @property
    def metrics(self) -> tuple[str, ...]:
        return TASK_METRICS[self.task]

    @property
    def headline(self) -> str:
        """The metric tables are sorted and plotted by: BLEU or ROUGE-L."""
        return "bleu" if self.task == "translation" else "rougeL"

    def train_overrides(self, entry: str, seed: int, runs_root: Path) -> list[str]:
        """The `zoo.train` command line of one (entry, seed) run of this suite (a variant: its entry, renamed,
        with its model overrides last so they win)."""
        variant = self.variants.get(entry)
        args = [f"+model={variant.entry if variant else entry}", f"data={self.data}"]
        if self.size:
            args.append(f"size={self.size}")
        if self.trainer:
            args.append(f"trainer={self.trainer}")
        if self.experiment:
            args.append(f"experiment={self.experiment}")
        args += [f"trainer.seed={seed}", f"runs_root={runs_root}", *self.overrides]
        if variant:
            args += [f"model.name={variant.name}", *variant.overrides]
            args += [f"trainer.max_updates={variant.updates}"] if variant.updates else []
        return args


def available_entries(conf_dir: Path) -> list[str]:
    return sorted(p.stem for p in (conf_dir / "model").glob("*.yaml"))


def _rounds(value: Any) -> int:
    """speed.rounds: how often every entry is timed (a speed verdict needs at least 5: zoo/report/speed_rule.py)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SuiteError(f"suite.speed.rounds={value!r}: give a positive integer (5 or more for a verdict)")
    return value


def suite_from_config(node: DictConfig, conf_dir: Path) -> Suite:
    """Validate a composed `suite` node up front: a typo should fail before hours of training, not after."""
    raw: dict[str, Any] = OmegaConf.to_container(node, resolve=True)  # type: ignore[assignment]
    missing = [k for k in ("name", "task", "data", "seeds", "baseline", "entries") if raw.get(k) in (None, [], "")]
    if missing:
        raise SuiteError(f"suite is missing {', '.join(missing)}; see conf/suite/quick.yaml for a complete one")
    if raw["task"] not in TASK_METRICS:
        raise SuiteError(f"suite.task={raw['task']!r}; expected one of {', '.join(TASK_METRICS)}")
    entries_on_file = available_entries(conf_dir)
    variants = _variants(raw.get("variants") or {}, entries_on_file)
    known = [*entries_on_file, *variants]
    unknown = [e for e in raw["entries"] if e not in known]
    if unknown:
        raise SuiteError(f"suite.entries has unknown entries {unknown}; known entries: {', '.join(known)}")
    if raw["baseline"] not in entries_on_file:
        raise SuiteError(f"suite.baseline={raw['baseline']!r} is not an entry; known entries: {', '.join(known)}")
    if raw["baseline"] not in raw["entries"]:  # `suite.entries=[mixhead_a]` grows a suite: Δ needs the baseline
        raw["entries"] = [raw["baseline"], *raw["entries"]]
    if len(set(raw["entries"])) != len(raw["entries"]):
        raise SuiteError("suite.entries lists an entry twice")
    for v in variants.values():
        # init_from needs its source's run; branch_from only saves updates (a GHT-PS without its GHT run on this
        # machine trains from scratch, the same run), so its source may be left out — but not listed after it
        listed = raw["entries"]
        for key, source in (("init_from", v.init_from), ("branch_from", v.branch_from)):
            optional = key == "branch_from" and source not in listed
            if source and v.name in listed and not optional and source not in listed[: listed.index(v.name)]:
                raise SuiteError(
                    f"suite.variants.{v.name}: {key}={source!r} must be an entry of suite.entries listed before "
                    f"{v.name} (its run of the same seed is trained first)"
                )
    seeds = tuple(int(s) for s in raw["seeds"])
    if len(set(seeds)) != len(seeds):
        raise SuiteError(f"suite.seeds={list(seeds)} repeats a seed")
    margin = float(raw["equivalence_margin"]) if raw.get("equivalence_margin") is not None else None
    claims = _claims(str(raw["name"]), raw.get("claims") or [], known, raw["entries"], margin)
    speed = raw.get("speed") or {}
    settings = tuple(
        SpeedSetting(
            name=str(s["name"]),
            beam_size=int(s["beam_size"]),
            batch=int(s["batch"]),
            max_len_a=float(s.get("max_len_a", DEFAULT_SEARCH.max_len_a)),
            max_len_b=int(s.get("max_len_b", DEFAULT_SEARCH.max_len_b)),
        )
        for s in speed.get("settings", [])
    )
    speed_seed = int(speed.get("seed", seeds[0]))
    try:
        second_look = second_look_from(raw.get("second_look"))
    except ValueError as exc:
        raise SuiteError(str(exc)) from exc
    return Suite(
        name=str(raw["name"]),
        task=str(raw["task"]),
        data=str(raw["data"]),
        size=raw.get("size"),
        trainer=raw.get("trainer"),
        experiment=raw.get("experiment"),
        seeds=seeds,
        baseline=str(raw["baseline"]),
        entries=tuple(raw["entries"]),
        overrides=tuple(raw.get("overrides") or ()),
        speed_enabled=bool(speed.get("enabled", True)),
        speed_seed=speed_seed,
        speed_sentences=int(speed.get("sentences", 512)),
        speed_threads=speed.get("threads"),
        speed_rounds=_rounds(speed.get("rounds", 5)),
        speed_claims=_speed_claims(str(raw["name"]), speed.get("claims") or [], settings, list(raw["entries"])),
        speed_controls=_speed_controls(str(raw["name"]), speed.get("controls") or [], settings, list(raw["entries"])),
        speed_settings=settings,
        triton=dict(speed.get("triton") or {}),  # type: ignore[arg-type]
        variants={n: v for n, v in variants.items() if n in raw["entries"]},
        claims=claims,
        equivalence_margin=margin,
        compaction=_compaction(raw.get("compaction"), known, list(raw["entries"])),
        probe=_probe(raw.get("probe")),
        second_look=second_look,
    )


def _compaction(raw: dict[str, Any] | None, known: list[str], entries: list[str]) -> CompactionRule | None:
    """The scan rule, its scans narrowed like the claims to this (possibly narrowed) suite's entries: a name that is
    no entry or variant at all is a typo and refused; `suite.entries=[ght_v_x16]` trains one setting."""
    if not raw:
        return None
    keys = {"silhouette", "collapse_intra", "collapse_inter", "max_quality_loss", "scans"}
    if set(raw) != keys:
        raise SuiteError(f"suite.compaction needs exactly {sorted(keys)}; got {sorted(raw)}")
    scans = []
    for i, scan in enumerate(raw["scans"]):
        if set(scan) != {"name", "reference", "entries"}:
            raise SuiteError(f"suite.compaction.scans[{i}] needs name, reference and entries (weakest first)")
        listed = [scan["reference"], *scan["entries"]]
        if unknown := [e for e in listed if e not in known]:
            raise SuiteError(f"suite.compaction.scans[{i}] names {unknown}, which are neither entries nor variants")
        present = tuple(str(e) for e in scan["entries"] if e in entries)
        if scan["reference"] in entries and present:
            scans.append(CompactionScan(str(scan["name"]), str(scan["reference"]), present))
    return CompactionRule(
        silhouette=float(raw["silhouette"]),
        collapse_intra=float(raw["collapse_intra"]),
        collapse_inter=float(raw["collapse_inter"]),
        max_quality_loss=float(raw["max_quality_loss"]),
        scans=tuple(scans),
    )


def _probe(raw: dict[str, Any] | None) -> BudgetProbe | None:
    """A budget probe's rule, refused unless its budgets rise and its thresholds are numbers."""
    if not raw:
        return None
    keys = {"budgets", "min_gain", "min_distinct"}
    if set(raw) != keys:
        raise SuiteError(f"suite.probe needs exactly {sorted(keys)}; got {sorted(raw)}")
    budgets = tuple(int(b) for b in raw["budgets"])
    if len(budgets) < 2 or any(b <= a for a, b in itertools.pairwise(budgets)) or budgets[0] <= 0:
        raise SuiteError(f"suite.probe.budgets={list(budgets)}: give two or more rising update counts")
    return BudgetProbe(budgets, float(raw["min_gain"]), float(raw["min_distinct"]))


def require_speed_seed(suite: Suite) -> None:
    """Checked only when the speed stage runs, so that `suite.seeds=[3]` can train seed 3 alone."""
    if suite.speed_enabled and suite.speed_seed not in suite.seeds:
        raise SuiteError(
            f"suite.speed.seed={suite.speed_seed} is not one of suite.seeds={list(suite.seeds)}: "
            "the speed stage times one trained seed's records; set suite.speed.seed to one of them"
        )


def _variants(raw: dict[str, Any], entries_on_file: list[str]) -> dict[str, Variant]:
    out: dict[str, Variant] = {}
    for name, spec in raw.items():
        if not VARIANT_NAME.match(str(name)) or name in entries_on_file:
            raise SuiteError(
                f"suite.variants.{name}: a variant needs a new name of letters, digits and _ "
                "(it names run dirs and records), not an existing entry's"
            )
        if not isinstance(spec, dict) or spec.get("entry") not in entries_on_file:
            raise SuiteError(
                f"suite.variants.{name}: expected {{entry: <an entry of conf/model/>, overrides: "
                f"[model.key=value, ...]}}, got {spec!r}"
            )
        overrides = tuple(str(o) for o in spec.get("overrides") or ())
        bad = [o for o in overrides if not o.startswith(VARIANT_KEYS) or "=" not in o or o.startswith("model.name=")]
        if bad:
            raise SuiteError(
                f"suite.variants.{name}: overrides {bad} — a variant changes model.<key>=<value>, "
                "trainer.precision=<fp32|bf16|fp16>, trainer.lr_schedule=<inverse_sqrt|linear> or trainer.lr=<peak> "
                "only (its name is the variant's; the rest of trainer.* is the suite's budget: suite.overrides)"
            )
        init_from, updates = spec.get("init_from"), spec.get("updates")
        if (init_from is None) != (updates is None) or (
            init_from is not None and (isinstance(updates, bool) or not isinstance(updates, int) or updates < 1)
        ):
            raise SuiteError(
                f"suite.variants.{name}: an uptrained variant gives both init_from: <an entry of the suite, listed "
                f"before it> and updates: <a positive number of further updates>; got init_from={init_from!r}, "
                f"updates={updates!r}"
            )
        branch_from = spec.get("branch_from")
        if branch_from is not None and init_from is not None:
            raise SuiteError(f"suite.variants.{name}: init_from and branch_from both given; a variant starts from one")
        branch = None if branch_from is None else str(branch_from)
        out[str(name)] = Variant(str(name), str(spec["entry"]), overrides, init_from, updates, branch)
    return out


def _claims(
    suite: str, raw: list[Any], known: list[str], entries: list[str], suite_margin: float | None
) -> tuple[Claim, ...]:
    """The suite's claims whose two runs are in this (possibly narrowed) suite; a name that is no entry or
    variant at all is a typo and refused, and so is a paper claim without its quoted source."""
    claims = []
    for i, c in enumerate(raw):
        if not isinstance(c, dict) or any(not c.get(k) for k in CLAIM_KEYS):
            raise SuiteError(f"suite.claims[{i}]: needs {', '.join(CLAIM_KEYS)}; got {c!r}")
        unknown = [c[k] for k in ("system", "baseline") if c[k] not in known]
        if unknown:
            raise SuiteError(f"suite.claims[{i}]: {unknown} is neither an entry nor one of suite.variants")
        if c["expect"] not in EXPECTATIONS:
            raise SuiteError(f"suite.claims[{i}]: expect={c['expect']!r}; choose from {', '.join(EXPECTATIONS)}")
        source = _source(suite, i, c)
        margin = c.get("margin", suite_margin)
        if c["expect"] in MARGIN_EXPECTATIONS and margin is None:
            raise SuiteError(
                f"suite {suite}, claim {i} ({c['claim']!r}): expect={c['expect']} needs a margin; set the suite's "
                "equivalence_margin (e.g. 0.5 BLEU) or the claim's margin"
            )
        if c["system"] in entries and c["baseline"] in entries:
            claims.append(
                Claim(
                    *(str(c[k]) for k in CLAIM_KEYS),
                    source=source,
                    margin=float(margin) if c["expect"] in MARGIN_EXPECTATIONS else None,
                    post_hoc=bool(c.get("post_hoc", False)),
                )
            )
    return tuple(claims)


def _speed_claims(
    suite: str, raw: list[Any], settings: tuple[SpeedSetting, ...], entries: list[str]
) -> tuple[SpeedClaim, ...]:
    """`speed.claims`: each names two entries, a measured point and the paper's quoted sentence (ours: none)."""
    points = {f"{s.name}/{p}" for s in settings for p in ("fp32", "int8")} | {"served"}
    claims = []
    for i, c in enumerate(raw):
        keys = ("paper", "claim", "system", "baseline", "point")
        if not isinstance(c, dict) or any(not c.get(k) for k in keys):
            raise SuiteError(f"suite {suite}: speed.claims[{i}] needs {', '.join(keys)}; got {c!r}")
        if c["point"] not in points:
            raise SuiteError(f"suite {suite}: speed.claims[{i}].point={c['point']!r}; choose from {sorted(points)}")
        source = _source(suite, i, c)
        if c["system"] in entries and c["baseline"] in entries:
            claims.append(SpeedClaim(*(str(c[k]) for k in keys), source=source))
    return tuple(claims)


def _speed_controls(
    suite: str, raw: list[Any], settings: tuple[SpeedSetting, ...], entries: list[str]
) -> tuple[SpeedControl, ...]:
    """`speed.controls`: each names two entries of the same decoding work, why it is, and optionally its points;
    kept only when both entries are in this (possibly narrowed) suite."""
    known = {f"{s.name}/{p}" for s in settings for p in ("fp32", "int8")} | {"served"}
    controls = []
    for i, c in enumerate(raw):
        keys = ("system", "baseline", "why")
        if not isinstance(c, dict) or any(not c.get(k) for k in keys):
            raise SuiteError(f"suite {suite}: speed.controls[{i}] needs {', '.join(keys)}; got {c!r}")
        points = c.get("points")
        bad = [p for p in points or () if p not in known]
        if bad:
            raise SuiteError(f"suite {suite}: speed.controls[{i}].points {bad}; choose from {sorted(known)}")
        if c["system"] in entries and c["baseline"] in entries:
            pts = tuple(str(p) for p in points) if points else None
            controls.append(SpeedControl(str(c["system"]), str(c["baseline"]), " ".join(str(c["why"]).split()), pts))
    return tuple(controls)


def _source(suite: str, i: int, claim: dict[str, Any]) -> Source | None:
    """A paper claim's `source: {paper, where, quote}`; `paper: ours` needs none (and may not pretend one)."""
    raw = claim.get("source")
    if claim["paper"] == OURS:
        if raw:
            raise SuiteError(f"suite {suite}, claim {i} ({claim['claim']!r}): paper: ours quotes no paper; drop source")
        return None
    if not isinstance(raw, dict) or any(not str(raw.get(k) or "").strip() for k in SOURCE_KEYS):
        raise SuiteError(
            f"suite {suite}, claim {i} ({claim['claim']!r}) has no source: add source: {{paper, where, quote}} "
            "quoting the sentence of the paper that makes it, or mark a question of our own paper: ours"
        )
    return Source(*(" ".join(str(raw[k]).split()) for k in SOURCE_KEYS))
