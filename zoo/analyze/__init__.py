"""`python -m zoo.analyze checkpoint=<run dir|.pt>` or `checkpoints=[a,b,…]`: how high-rank are a model's
attention scores and maps?

The concise-attention, Mixhead and MGK papers all argue about rank: a head of size d_p scores a
sentence of n tokens with S = Q Kᵀ of rank ≤ min(n, d_p) (Bhojanapalli et al. 2020, Theorem 1: the
low-rank bottleneck for n > d_p). This runs every checkpoint teacher-forced on a sample of held-out
sentence pairs (in float64 by default, so the tolerances measure the model, not float32 noise) and
computes, per module = layer × attention kind:

  * `zoo.analyze.scores` — the numerical rank of every head's *pre-softmax* score matrix Q_h K_hᵀ
    (σ_i > `qk_tol`·σ_max, relative, default 1e-6), per sentence, against n: per length bucket of
    `qk_bucket` tokens the mean rank and the fraction of heads whose rank reaches min(n, d_p), and the
    same over the sentences longer than the head size (n ≥ `qk_min_len`, default d_p + 1). Mixhead:
    before mixing; MGK: each key component separately; linear attention / MLK: skipped (no score matrix);
  * `zoo.analyze.maps` — the rank distribution (σ > `threshold`, absolute, 1e-6: the MGK paper's
    analysis) and normalised cumulative singular-value curve (the Mixhead paper's Fig. 1/3) of the
    *post-softmax* maps: "A", the map that weights the values (Mixhead: mixed), or `map=A_unmixed`;
  * optionally (`figure_sentence=<i>`) every head's post-softmax map of one module (`figure_module`,
    default the last encoder layer's self-attention) for sentence pair i; Mixhead: unmixed and mixed.

Outputs (`out=`, default `<first checkpoint's run dir>/analysis/`): `qk_rank.png` (rank vs n, one line
per checkpoint, with y = n and y = d_p) and `qk_rank.json`; per checkpoint `analysis.json`, `ranks.png`,
`singular_values.png` and `attention_maps_s<i>_<module>.png` — in the output dir itself for one
checkpoint, in `<out>/<entry>/` for several. The functions are pure where they can be and work on any
constructed matrices.
"""

from __future__ import annotations

from zoo.analyze.figures import plot_score_ranks, plot_sentence_maps, sentence_maps
from zoo.analyze.maps import (
    collect_maps,
    crop_maps,
    cumulative_singular_values,
    matrix_ranks,
    module_kind,
    module_lengths,
    rank_histogram,
    resample_curve,
    singular_values,
    summarise_maps,
)
from zoo.analyze.run import AnalyzeError, analyze, checkpoint_locations
from zoo.analyze.scores import (
    bucket_ranks,
    collect_scores,
    length_bucket,
    numerical_ranks,
    rank_stats,
    score_rank_report,
    summarise_score_ranks,
)

__all__ = [
    "AnalyzeError",
    "analyze",
    "bucket_ranks",
    "checkpoint_locations",
    "collect_maps",
    "collect_scores",
    "crop_maps",
    "cumulative_singular_values",
    "length_bucket",
    "matrix_ranks",
    "module_kind",
    "module_lengths",
    "numerical_ranks",
    "plot_score_ranks",
    "plot_sentence_maps",
    "rank_histogram",
    "rank_stats",
    "resample_curve",
    "score_rank_report",
    "sentence_maps",
    "singular_values",
    "summarise_maps",
    "summarise_score_ranks",
]
