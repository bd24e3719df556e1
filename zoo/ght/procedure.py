"""GHT and GHT-PS as a trainer `Procedure`: one command runs group-constrained training (GCT),
then Voting-to-Stay, then masked fine-tuning with the task loss only; the stage, groups, probe
history and head plan live in `last.pt`, so `resume=` continues in the right stage."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from zoo.checkpoint import save_checkpoint
from zoo.data.batching import Batch, collate
from zoo.ght.constraint import compactness, group_constraint_loss
from zoo.ght.features import MODULE_KINDS, head_points, module_kind
from zoo.ght.kmeans import group_means, kmeans
from zoo.ght.options import GHTOptions, Stage
from zoo.ght.voting import fixed_groups, head_votes, plot_votes, select_heads
from zoo.model import Transformer
from zoo.training import branch_point
from zoo.training import distributed as dist
from zoo.training.optim import budget_reached
from zoo.training.procedure import Procedure
from zoo.training.trainer import Trainer, spread_sample

log = logging.getLogger("zoo.ght")


class GHTProcedure(Procedure):
    def __init__(self, options: GHTOptions, started_from_weights: bool = False) -> None:
        self.options = options
        self.stage = Stage(options.init_stage) if (started_from_weights and options.prune) else Stage.GCT
        self.labels: dict[str, Tensor] = {}  # the trained partition: the groups the loss uses, [H] per module
        self.probe_labels: dict[str, list[int]] = {}  # the probe batch's own k-means partition (a second view)
        self.probe_centres: dict[str, Tensor] = {}  # the trained partition's centres on the probe batch
        self.trained_at_check: dict[str, list[int]] = {}  # the trained partition at the previous check
        # per module since the last check: Σ gc_homogeneity, Σ gc_diversity, updates whose k-means changed
        # the trained partition (device tensors, read at the check), and the number of updates summed
        self.since_check: dict[str, Tensor] = {}
        self.updates_since_check = 0
        self.converged_checks = 0
        self.plan: dict[str, list[int]] = {}
        self.votes: dict[str, list[int]] = {}
        self.step = 0
        self._frozen: list[tuple[Tensor, Tensor, Tensor]] = []  # (param, mask, param's values when frozen)
        self.trigger = ""  # why voting started: vote_at, convergence, or init_from weights
        self.final_groups: dict[str, list[int]] = {}  # the groups that voted
        self.groups_source = ""
        self.voting_seconds = 0.0
        self.branched_at = 0  # GHT: the update whose state it kept as its branch point (0: not reached yet)

    # ------------------------------------------------------------------ wiring
    def bind(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.modules = {
            n: m for n, m in trainer.bare.attention_modules().items() if module_kind(n) in self.options.modules
        }
        self._set_capture(self.stage == Stage.GCT)

    def _set_capture(self, on: bool, maps: tuple[str, ...] | None = None) -> None:
        for module in self.modules.values():
            module.capture = (maps or (self.options.feature_map,)) if on else ()
            module.captured = {}

    @staticmethod
    def _masks(batch: Batch, pad_id: int) -> dict[str, Tensor]:
        # the target positions from tgt_out (target + eos), which has tgt_in's (start + target) length: a model
        # whose decoder starts from pad (converted Marian) would lose position 0 to tgt_in.ne(pad)
        return {"src": batch.src.ne(pad_id), "tgt": batch.tgt_out.ne(pad_id)}

    def _points(self, masks: dict[str, Tensor], feature_map: str | None = None) -> dict[str, Tensor]:
        out = {}
        for name, module in self.modules.items():
            q_side, k_side = MODULE_KINDS[module_kind(name)]
            out[name] = head_points(module, feature_map or self.options.feature_map, masks[q_side], masks[k_side])
        return out

    def _cluster(self, points: Tensor, previous: list[int] | Tensor | None) -> Any:
        init = torch.as_tensor(previous) if previous is not None else None
        o = self.options
        return kmeans(points, o.groups, iters=o.kmeans_iters, seed=o.seed, init_labels=init)

    def _cluster_training(self, points: Tensor, previous: Tensor | None) -> Tensor:
        """[M, H, F] → [M, H] the training partition: warm-started from `previous`, or (kmeans_init=fixed_heads)
        from the same heads' points on every update, as the official code clusters."""
        o = self.options
        if o.kmeans_init == "fixed_heads":
            heads = official_init_heads(points.shape[-2], o.groups)
            return kmeans(points, o.groups, iters=o.kmeans_iters, init_points=heads).labels
        return self._cluster(points, previous).labels

    # ------------------------------------------------------------------ GCT loss
    def aux_loss(self, trainer: Trainer, batch: Batch) -> tuple[Tensor | None, dict[str, float]]:
        if self.stage != Stage.GCT or not self.modules:
            return None, {}
        points = self._points(self._masks(batch, trainer.bare.cfg.pad_id))
        alpha = self.options.alpha if self.options.homogenize else 0.0
        beta = self.options.beta if self.options.diversify else 0.0
        module_losses: dict[str, Tensor] = {}
        homs, divs = [], []
        for names, stacked in _same_shape_batches(points):  # [M, H, F]
            # the groups so far ([M, H]; .to: a no-op but after a resume), kept between k-means runs
            known = all(n in self.labels for n in names)
            labels = torch.stack([self.labels[n] for n in names]).to(stacked.device) if known else None
            changed = torch.zeros(len(names), device=stacked.device)  # [M]
            if labels is None or self.step % self.options.kmeans_every == 0:
                new = self._cluster_training(stacked, labels)  # [M, H]
                if labels is not None:
                    changed = (new != labels).any(-1).to(changed.dtype)
                labels = new
                self.labels.update(zip(names, labels.unbind(0), strict=True))
            loss, hom, div = group_constraint_loss(stacked, labels, self.options.groups, alpha, beta)  # [M] each
            self._accumulate(names, torch.stack([hom.float(), div.float(), changed], dim=1))  # [M, 3]
            module_losses.update(zip(names, loss.unbind(0), strict=True))
            homs.append(hom)
            divs.append(div)
        for m in self.modules.values():
            m.captured = {}  # free the maps now that the loss holds what it needs
        per_module = torch.stack([module_losses[n] for n in points])  # [modules], in module order
        # one host read for the logged numbers (per module at α, β strength, comparable across settings)
        # (in float64, where the float32 terms add exactly: the numbers a sum of floats gave before)
        logged, hom_mean, div_mean = torch.stack(
            [per_module.detach().mean().double(), torch.cat(homs).double().mean(), torch.cat(divs).double().mean()]
        ).tolist()
        if self.options.loss_normalization == "token_sum":
            # the official criterion adds every module's terms into one sum on top of the token-summed task
            # loss, and fairseq divides the whole by the batch's target tokens
            total = per_module.sum() / max(batch.ntokens, 1)
        else:
            total = per_module.mean()
        self.updates_since_check += 1
        return total * self.options.constraint_scale, {
            "gc_loss": logged,
            "gc_homogeneity": hom_mean,
            "gc_diversity": div_mean,
        }

    def _accumulate(self, names: list[str], values: Tensor) -> None:
        """Add one update's [M, 3] (homogeneity, diversity, partition changed) to the sums since the check."""
        for name, row in zip(names, values.detach().unbind(0), strict=True):
            self.since_check[name] = self.since_check[name] + row if name in self.since_check else row.clone()

    def _read_since_check(self) -> dict[str, dict[str, float]]:
        """Per module: mean gc_homogeneity / gc_diversity over the updates since the last check and the number of
        those updates whose k-means changed the trained partition; resets the sums."""
        n = max(self.updates_since_check, 1)
        out = {}
        for name, sums in self.since_check.items():
            hom, div, changes = sums.tolist()
            out[name] = {
                "gc_homogeneity": round(hom / n, 4),
                "gc_diversity": round(div / n, 4),
                "changes": int(changes),
            }
        self.since_check, self.updates_since_check = {}, 0
        return out

    # ------------------------------------------------------------------ stages
    def on_start(self, trainer: Trainer) -> None:
        if self.stage == Stage.GCT and trainer.state.step == 0 and not self.probe_labels:
            self._probe(trainer)  # compactness before any group-constrained update: the "before GCT" row
        if self.stage == Stage.VOTE:
            self.trigger = "init_from: voting on trained GHT weights"
            self._vote(trainer)

    def after_optimizer_step(self, trainer: Trainer) -> None:
        with torch.no_grad():
            for param, mask, values in self._frozen:
                param.data.copy_(torch.where(mask, values, param.data))  # a masked copy needs no host sync

    def after_update(self, trainer: Trainer) -> None:
        self.step = trainer.state.step
        if self.stage != Stage.GCT:
            return
        spent = self._vote_budget_spent(trainer)
        if spent and not self.options.prune and not self.branched_at:
            # where a GHT-PS of these options votes: the state before this update's probe, for its branch_from=
            self.branched_at = self.step
            branch_point.save(trainer, trainer.ckpt_dir / branch_point.FOLDER)
        checked = self.step % self.options.check_every == 0
        if checked:
            self._probe(trainer)
        if not self.options.prune:
            return
        vote_at = self.options.vote_at
        if self.options.vote_trigger == "converged" and self.converged_checks >= self.options.patience:
            why = "trained groups' centres converged on the probe batch"
        elif spent == "max_updates":
            why = f"reached vote_at={vote_at}"
        elif spent == "max_minutes":
            why = f"reached vote_at={vote_at} of max_minutes={trainer.cfg.max_minutes or 0}"
        else:
            return
        log.info("GCT stage ends at update %d (%s): Voting-to-Stay", self.step, why)
        self.trigger = why
        self._vote(trainer)

    def _vote_budget_spent(self, trainer: Trainer) -> str:
        """Which budget says it is time to vote ("max_updates", "max_minutes", or ""). A fractional vote_at is a
        fraction of the budget, by the trainer's own rule: on the CPU preset the budget that ends training is wall
        time (max_minutes), not max_updates — without it GCT never reaches voting there."""
        vote_at, cfg = self.options.vote_at, trainer.cfg
        if vote_at >= 1:
            return "max_updates" if self.step >= vote_at else ""
        return budget_reached(vote_at, self.step, cfg.max_updates, trainer.state.elapsed_s, cfg.max_minutes or 0)

    def stop_reason(self, trainer: Trainer) -> str:
        fp = self.options.finetune_patience
        if self.stage == Stage.FINETUNE and fp and trainer.state.bad_validations >= fp:
            return f"fine-tuning early stopping: no improvement in {fp} validations"
        return ""

    # ------------------------------------------------------------------ convergence probe
    @torch.no_grad()
    def _probe(self, trainer: Trainer) -> dict[str, Any]:
        """Compactness of the trained partition (the groups the loss pulls together) on a fixed probe batch, with
        the probe batch's own k-means partition beside it as a second view; the trained centres' shift since
        the last check feeds the optional convergence trigger."""
        model = trainer.bare
        was_training = model.training
        model.eval()
        tok = trainer.tokenizer
        pairs = spread_sample(trainer.valid_pairs, self.options.probe_sentences)  # every data source
        batch = collate(list(pairs), tok.pad_id, tok.bos_id, tok.eos_id).to(trainer.device)
        self._set_capture(True)
        model(batch.src, batch.tgt_in)
        points = self._points(self._masks(batch, tok.pad_id))
        self._set_capture(self.stage == Stage.GCT)
        model.train(was_training)
        report: dict[str, Any] = {"step": self.step, "modules": {}}
        training = self._read_since_check()
        stable, shifts = True, []
        n_groups = self.options.groups
        for name, p in points.items():
            p = p.float()  # [H, F]
            own = self._cluster(p, self.probe_labels.get(name))
            self.probe_labels[name] = own.labels.tolist()
            trained = name in self.labels
            labels = self.labels[name].to(p.device) if trained else own.labels  # [H]
            row = compactness(p, labels, n_groups)
            row["partition"] = "trained" if trained else "probe (no training update yet)"
            if trained:
                row.update(training.get(name, {}))
                centres = group_means(p, labels, n_groups)  # [C, F]
                listed = labels.tolist()
                if name in self.probe_centres and self.trained_at_check.get(name) == listed:
                    old = self.probe_centres[name]
                    shifts.append(float((centres - old).norm() / old.norm().clamp(min=1e-12)))
                else:
                    stable = False
                self.trained_at_check[name], self.probe_centres[name] = listed, centres
            else:
                stable = False
            own_row = compactness(p, own.labels, n_groups)
            row["probe"] = {key: own_row[key] for key in ("groups", "intra_cos", "inter_cos", "silhouette")}
            report["modules"][name] = row
        shift = max(shifts) if shifts else float("inf")
        self.converged_checks = self.converged_checks + 1 if stable and shift < self.options.shift_threshold else 0
        rows = list(report["modules"].values())
        means = {
            key: sum(m[key] for m in rows) / max(len(rows), 1)
            for key in ("intra_cos", "inter_cos", "silhouette", "dunn")
        }
        means["probe_silhouette"] = sum(m["probe"]["silhouette"] for m in rows) / max(len(rows), 1)
        changes = [m["changes"] for m in rows if "changes" in m]
        if changes:
            means["changes"] = sum(changes)  # updates × modules whose trained partition changed since the last check
        report.update(centre_shift=shift, converged_checks=self.converged_checks, mean=means)
        log.info(
            "GHT probe @%d: intra cos %.3f inter cos %.3f silhouette %.3f dunn %.3f shift %.3g (%d/%d)",
            self.step,
            means["intra_cos"],
            means["inter_cos"],
            means["silhouette"],
            means["dunn"],
            shift,
            self.converged_checks,
            self.options.patience,
        )
        if dist.is_main():
            out = trainer.run_dir / "ght"
            out.mkdir(exist_ok=True)
            with (out / "compactness.jsonl").open("a") as f:
                f.write(json.dumps(report) + "\n")
        return report

    # ------------------------------------------------------------------ Voting-to-Stay
    @torch.no_grad()
    def _vote(self, trainer: Trainer) -> None:
        model = trainer.bare
        model.eval()  # attention (and everything else) frozen: forward passes only
        self._probe(trainer)  # the final groups, and compactness at the end of GCT
        if dist.is_main():
            save_checkpoint(trainer.ckpt_dir / "gct_end.pt", trainer.model_payload())
        tok = trainer.tokenizer
        batches = trainer.sampler.batches(10_000 + trainer.state.epoch, rank=trainer.rank, world_size=trainer.world)
        if self.options.vote_batches:
            batches = batches[: self.options.vote_batches]
        # [H] counts on the model's device, and the voting groups there: no host read per batch
        counts = {name: torch.zeros(m.num_heads, device=trainer.device) for name, m in self.modules.items()}
        self.final_groups, self.groups_source = self._voting_groups()
        groups = {name: torch.tensor(self.final_groups[name], device=trainer.device) for name in self.modules}
        maps = tuple(self.options.vote_maps)
        self._set_capture(True, maps)
        start = time.perf_counter()
        shown = trainer.cfg.progress and dist.is_main()
        # Algorithm 1: every batch, every module, every map votes, with the trained groups
        for ids in tqdm(batches, desc=f"voting ({'/'.join(maps)})", unit="batch", disable=not shown):
            batch = collate([trainer.train_pairs[i] for i in ids], tok.pad_id, tok.bos_id, tok.eos_id)
            batch = batch.to(trainer.device)
            model(batch.src, batch.tgt_in)
            masks = self._masks(batch, tok.pad_id)
            for feature_map in maps:
                for names, stacked in _same_shape_batches(self._points(masks, feature_map)):  # [M, H, F]
                    labels = torch.stack([groups[n] for n in names])  # [M, H]
                    votes = head_votes(stacked, fixed_groups(stacked, labels, self.options.groups))  # [M, H]
                    for name, v in zip(names, votes.unbind(0), strict=True):
                        counts[name] += v
        self._set_capture(False)
        votes = {name: [int(v) for v in c.tolist()] for name, c in counts.items()}
        self.voting_seconds = round(time.perf_counter() - start, 1)
        log.info("Voting-to-Stay: %d batches × %d maps in %.1f s", len(batches), len(maps), self.voting_seconds)
        names = list(votes)
        flat = dist.all_reduce_sum([float(v) for n in names for v in votes[n]])
        heads = [len(votes[n]) for n in names]
        offset = 0
        for n, h in zip(names, heads, strict=True):
            votes[n] = [int(v) for v in flat[offset : offset + h]]
            offset += h
        self.votes = votes
        o = self.options
        self.plan = {
            n: select_heads(votes[n], self.final_groups[n], o.groups, o.selection, o.seed + i)
            for i, n in enumerate(names)
        }  # a seed per module: random ablations differ across modules
        self._apply_plan(model)
        self.stage = Stage.FINETUNE
        trainer.restart_selection()
        model.train()
        for name, kept in self.plan.items():
            log.info("kept heads %s: %s (votes %s)", name, kept, votes[name])
        if dist.is_main():
            self._write_report(trainer, len(batches))
            save_checkpoint(trainer.ckpt_dir / "voted.pt", trainer.model_payload())
        trainer.save_last()

    def _voting_groups(self) -> tuple[dict[str, list[int]], str]:
        """The groups that vote: the partition the loss trained (the official code votes with its training
        clusters); weights from init_from= bring no trained partition, so there the probe batch's own k-means."""
        if all(name in self.labels for name in self.modules):
            return {name: [int(g) for g in self.labels[name].tolist()] for name in self.modules}, "trained"
        return {name: list(self.probe_labels[name]) for name in self.modules}, "probe batch k-means (no trained groups)"

    def _apply_plan(self, model: Transformer) -> None:
        """Gate pruned heads off and freeze their slices of q/k/v rows and out_proj columns."""
        model.apply_head_plan(self.plan, remove=False)
        self._frozen = []
        modules = model.attention_modules()
        for name, kept in self.plan.items():
            m = modules[name]
            dropped = [h for h in range(m.num_heads) if h not in kept]
            if not dropped:
                continue
            rows = torch.zeros(m.num_heads * m.head_dim, dtype=torch.bool)
            for h in dropped:
                rows[h * m.head_dim : (h + 1) * m.head_dim] = True
            for proj_name in ("q_proj", *m.key_projections):
                proj = getattr(m, proj_name)
                self._freeze(proj.weight, rows[:, None].expand_as(proj.weight))
                if proj.bias is not None:
                    self._freeze(proj.bias, rows)
            self._freeze(m.out_proj.weight, rows[None, :].expand_as(m.out_proj.weight))

    def _freeze(self, param: Tensor, mask: Tensor) -> None:
        mask = mask.to(param.device).clone()
        self._frozen.append((param, mask, param.detach().clone()))

    def _write_report(self, trainer: Trainer, n_batches: int) -> None:
        out = trainer.run_dir / "ght"
        out.mkdir(exist_ok=True)
        report = {
            "step": self.step,
            "selection": self.options.selection,
            "groups": self.options.groups,
            "vote_maps": self.options.vote_maps,
            "voting_batches": n_batches,
            "voting_seconds": self.voting_seconds,
            "trigger": self.trigger,
            "final_groups": self.final_groups,
            "groups_source": self.groups_source,
            "probe_groups": self.probe_labels,
            "votes": self.votes,
            "plan": self.plan,
        }
        (out / "votes.json").write_text(json.dumps(report, indent=2))
        plot_votes(self.votes, self.plan, str(out / "votes.png"))

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage.value,
            "labels": {k: v.tolist() for k, v in self.labels.items()},
            "probe_labels": self.probe_labels,
            "probe_centres": self.probe_centres,
            "converged_checks": self.converged_checks,
            "trained_at_check": self.trained_at_check,
            "since_check": {k: v.tolist() for k, v in self.since_check.items()},
            "updates_since_check": self.updates_since_check,
            "final_groups": self.final_groups,
            "groups_source": self.groups_source,
            "plan": self.plan,
            "votes": self.votes,
            "step": self.step,
            "branched_at": self.branched_at,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        self.stage = Stage(state["stage"])
        self.labels = {k: torch.tensor(list(v)) for k, v in state["labels"].items()}
        self.probe_labels = {k: list(v) for k, v in state["probe_labels"].items()}
        self.probe_centres = dict(state["probe_centres"])
        self.converged_checks = state["converged_checks"]
        # (checkpoints written before the trained partition was recorded have none of these)
        self.trained_at_check = {k: list(v) for k, v in state.get("trained_at_check", {}).items()}
        device = next(self.trainer.bare.parameters()).device
        self.since_check = {k: torch.tensor(v, device=device) for k, v in state.get("since_check", {}).items()}
        self.updates_since_check = state.get("updates_since_check", 0)
        self.final_groups = {k: list(v) for k, v in state.get("final_groups", {}).items()}
        self.groups_source = state.get("groups_source", "")
        self.plan = {k: list(v) for k, v in state["plan"].items()}
        self.votes = {k: list(v) for k, v in state["votes"].items()}
        self.step = state["step"]
        self.branched_at = state.get("branched_at", 0)
        if self.plan:
            self._apply_plan(self.trainer.bare)  # weights already restored: re-arm the freeze
        self._set_capture(self.stage == Stage.GCT)


def official_init_heads(heads: int, groups: int) -> list[int]:
    """The head indices kmeans_pytorch starts from on every call in the official code: `np.random.seed(0);
    np.random.choice(heads, groups, replace=False)`."""
    import numpy as np

    return [int(i) for i in np.random.RandomState(0).choice(heads, groups, replace=False)]


def _same_shape_batches(points: dict[str, Tensor]) -> list[tuple[list[str], Tensor]]:
    """Modules whose points have one shape (the encoder's and the cross-attention's V, the decoder's), each
    set stacked as one batch ([M, H, F], float32): on a shared GPU GHT's rate follows its number of kernels."""
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for name, p in points.items():
        by_shape.setdefault(tuple(p.shape), []).append(name)
    return [(names, torch.stack([points[n] for n in names]).float()) for names in by_shape.values()]
