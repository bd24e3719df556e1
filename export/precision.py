"""The reduced-precision steps of an export (exporter.py's `int8` and `fp16`): the verified fp32 graphs replaced in
place by INT8 or float16 ones, each judged by its own rule — INT8 verified without failing on drift and its BLEU cost
measured against fp32's translations; float16 verified against the fp32 model and refused beyond its tolerance.
Apart from exporter.py because they share none of the fp32 steps' rules, only the torch comparison (`CheckGraphs`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnxruntime
from omegaconf import DictConfig

from export.graph import ExportError
from export.manifest import checksums, shared_weights, write_manifest
from export.onnx_files import half_graphs, quantize_graphs
from export.runtime import (
    PROVIDERS,
    ExportedModel,
    ExportRuntimeError,
    Int8Quality,
    Manifest,
    execution_providers,
    load,
)
from export.verify import ort_errors
from zoo.checkpoint import CheckpointPayload
from zoo.data import DataError, build_splits
from zoo.metrics import corpus_chrf, paired_bootstrap

PRECISIONS = ("fp32", "fp16")

# The graphs a runtime holds against the torch model on the held-out sample, without failing on differences:
# (runtime, max |Δ log-prob| allowed or None for verify.tolerance) → verify_export's report
CheckGraphs = Callable[[ExportedModel, float | None], dict[str, Any]]


def check_precision(cfg: DictConfig) -> None:
    """Refuse, before any work, a precision this exporter cannot make or verify here: an unknown one, float16 with
    INT8, float16 verified on a provider this onnxruntime lacks (fp16.provider=cuda without onnxruntime-gpu)."""
    precision = cfg.precision
    if precision not in PRECISIONS:
        raise ExportError(f"precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision != "fp16":
        return
    if cfg.quantize:
        raise ExportError("quantize=true and precision=fp16: INT8 quantisation works on fp32 graphs; give one of them")
    f = cfg.fp16
    if not 0 < float(f.tolerance) < math.inf or not 0 <= float(f.min_agreement) <= 1:
        raise ExportError(
            f"fp16.tolerance={f.tolerance} / fp16.min_agreement={f.min_agreement}: give a tolerance > 0 (max |Δ "
            "log-prob|) and an agreement share in [0, 1]"
        )
    if f.provider not in PROVIDERS:
        raise ExportError(f"fp16.provider={f.provider!r}: verify the fp16 graphs on one of {', '.join(PROVIDERS)}")
    try:
        execution_providers(f.provider)
    except ExportRuntimeError:
        raise ExportError(
            f"precision=fp16 fp16.provider={f.provider}: this onnxruntime ({onnxruntime.__version__}) has no "
            "CUDAExecutionProvider to verify the fp16 graphs on; install onnxruntime-gpu (the '.[gpu]' extra), or "
            "verify them on the CPU with fp16.provider=cpu"
        ) from None


# ---------------------------------------------------------------------------------------------- int8
def quantize_export(
    cfg: DictConfig,
    directory: Path,
    manifest: Manifest,
    fp32: ExportedModel,
    check: CheckGraphs,
    payload: CheckpointPayload,
    heldout: tuple[list[str], list[str]],
    beam_size: int,
) -> None:
    """INT8 graphs in place of the fp32 ones: verified without failing on drift (verification_int8), and their
    BLEU cost measured against the fp32 graphs' translations (int8_quality)."""
    eval_src, eval_ref, eval_split = _quality_pairs(cfg, payload, *heldout)
    with ort_errors("fp32"):
        fp32_out = fp32.translate(eval_src)
    quantize_graphs(directory)
    manifest["files"] = checksums(directory, manifest["graphs"])
    manifest["shared_weights"] = shared_weights(directory, manifest["graphs"])
    write_manifest(directory, manifest)
    with ort_errors("int8"):
        int8 = load(directory, threads=cfg.runtime.threads)
        manifest["verification_int8"] = check(int8, None)
        int8_out = int8.translate(eval_src)
    manifest["int8_quality"] = int8_quality(fp32_out, int8_out, eval_ref, eval_split, beam_size)


def _quality_pairs(
    cfg: DictConfig, payload: CheckpointPayload, srcs: list[str], tgts: list[str]
) -> tuple[list[str], list[str], str]:
    """(sources, references, split label) the INT8 quality cost is measured on: the checkpoint's test
    split when its corpus can be rebuilt here (`quantize_eval.split=test`), else the held-out sample."""
    q = cfg.quantize_eval
    limit = int(q.sentences) if q.sentences else None
    if q.split == "test":
        try:
            test = build_splits(payload["data_config"]).test[:limit]
        except (DataError, KeyError, OSError) as exc:
            print(f"(int8 quality: the test split cannot be rebuilt here ({exc}); using the held-out sample)")
        else:
            if test:
                return [e.src for e in test], [e.tgt for e in test], f"test ({len(test)} sentences)"
    elif q.split != "heldout":
        raise ExportError(f"quantize_eval.split={q.split!r}: use test or heldout")
    return srcs[:limit], tgts[:limit], f"heldout ({len(srcs[:limit])} sentences)"


def int8_quality(fp32_out: list[str], int8_out: list[str], refs: list[str], split: str, beam_size: int) -> Int8Quality:
    """BLEU of the fp32 and INT8 graphs' translations (same runtime, same search) with sacreBLEU's
    paired bootstrap: the quality cost of quantisation, claimed only if significant (zoo/DESIGN.md §3c)."""
    test = paired_bootstrap(fp32_out, int8_out, refs)
    return Int8Quality(
        split=split,
        beam_size=beam_size,
        bleu_fp32=test["baseline"]["bleu"],
        bleu_int8=test["system"]["bleu"],
        chrf_fp32=corpus_chrf(fp32_out, refs),
        chrf_int8=corpus_chrf(int8_out, refs),
        p_value=test["p_value"],
        significant=test["significant"],
        identical_outputs=sum(a == b for a, b in zip(fp32_out, int8_out, strict=True)),
    )


# ---------------------------------------------------------------------------------------------- fp16
def half_precision_export(cfg: DictConfig, directory: Path, manifest: Manifest, check: CheckGraphs) -> None:
    """float16 graphs in place of the fp32 ones (export/fp16.py), their caches float16 in the manifest, verified
    against the fp32 model on the held-out sample (verification_fp16, `fp16_verdict`): the export fails beyond
    fp16.tolerance or below fp16.min_agreement.

    Where it is verified: onnxruntime's CPU provider runs float16 graphs (it casts around the nodes it has no float16
    kernel for, and computes them in float32), so the default check runs anywhere and checks the conversion —
    weights, caches and the float16 nodes' rounding; fp16.provider=cuda checks it with the CUDA kernels that will run
    it (onnxruntime-gpu), which compute more in float16 than the CPU's casts do."""
    half_export(directory, manifest)
    f = cfg.fp16
    with ort_errors("fp16"):
        fp16 = load(directory, threads=cfg.runtime.threads, provider=f.provider)
        report = check(fp16, float(f.tolerance))
    verdict = fp16_verdict(report, float(f.min_agreement), f.provider)
    manifest["verification_fp16"] = verdict
    if not verdict["passed"]:
        raise ExportError(
            f"fp16 verification failed: {'; '.join(verdict['problems'])}; export the model in fp32 (without "
            "precision=fp16), or accept the difference with a larger fp16.tolerance / smaller fp16.min_agreement"
        )


def half_export(directory: Path, manifest: Manifest) -> None:
    """The export in `directory` (its fp32 graphs and `manifest`) made float16 in place: graphs converted
    (onnx_files.half_graphs), the manifest's precision, cache dtypes, checksums and shared weights following them,
    written."""
    dtypes = half_graphs(directory)
    manifest["precision"] = "fp16"
    manifest["caches"] = [{**c, "dtype": dtypes[c["name"]]} for c in manifest["caches"]]
    manifest["files"] = checksums(directory, manifest["graphs"])
    manifest["shared_weights"] = shared_weights(directory, manifest["graphs"])
    write_manifest(directory, manifest)


def fp16_verdict(report: dict[str, Any], min_agreement: float, provider: str) -> dict[str, Any]:
    """verify_export's report on float16 graphs — against torch's fp32 model, which the fp32 graphs equal within
    verify.tolerance with identical hypotheses — judged by float16's rule: the max |Δ log-prob| of the teacher-forced
    held-out steps within the report's tolerance, and beam search's output equal to fp32's for at least
    `min_agreement` of the held-out sentences. The other differences (logits, encoder states, caches, alignment,
    greedy and translate() agreement) are reported, not judged: float16 moves them all a little."""
    beam = report["beam"]
    agreement = beam["identical"] / max(beam["total"], 1)
    worst, tolerance = report["max_abs_log_probs_diff"], report["tolerance"]
    problems = []
    if not worst <= tolerance:  # NaN (an overflow) fails too
        problems.append(f"max |Δ log-prob| against fp32 {worst:.3g} > fp16.tolerance {tolerance:g}")
    if agreement < min_agreement:
        problems.append(
            f"beam search: {beam['identical']}/{beam['total']} held-out outputs equal to fp32's ({agreement:.0%} < "
            f"fp16.min_agreement {min_agreement:.0%})"
        )
    return {
        **report,
        "provider": provider,
        "min_agreement": min_agreement,
        "agreement": agreement,
        "passed": not problems,
        "problems": problems,
    }
