"""Word alignments from the decoder's cross-attention: per decoding step, one layer's cross-attention weights
averaged over that module's kept heads ([rows, S]; their argmax is the source position a target token aligns to).

Why one layer, averaged: the heads of a layer attend to different things, their mean is a soft alignment, and the
layer matters more than the heads (Garg et al. 2019, "Jointly Learning to Align and Translate with Transformer
Models": of a 6-layer decoder's layers, the penultimate one's head average aligned best). The default is therefore
the penultimate decoder layer (`default_alignment_layer`); fairseq's `alignment_layer` defaults to the last, which
Garg et al. found worse.

How: a mechanism with explicit attention probabilities (mha and GHT / GHT-PS, which are mha, mgk, mixhead) stores
its map as feature "A" when asked (the GHT capture of zoo/DESIGN.md §4); `CrossAttentionWeights.recording` asks
the one module for the length of one decoder call, so nothing is kept, and no other path changes, when alignments
are off. Mixhead's map is the mixed one, the map that weights its values. Mechanisms whose cached cross-attention
keeps only sums of the source (linear, MLK: `Attention.no_step_weights`) have no weight per source position and are
refused. Weights are exactly 0 at source padding (masked before the softmax; Mixhead's mixing keeps them 0).

The positions are source *pieces* (sentencepiece or BPE units, plus an eos where the tokenizer appends one), not
words: export/runtime/alignment.py maps them to words.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import Tensor

from export.runtime.search import SearchError
from zoo.attention import Attention
from zoo.model import Transformer

__all__ = ["CrossAttentionWeights", "check_alignments", "default_alignment_layer", "kept_heads"]


def default_alignment_layer(decoder_layers: int) -> int:
    """The penultimate decoder layer (the only one of a 1-layer decoder): Garg et al. 2019's best (module
    docstring)."""
    return max(decoder_layers - 2, 0)


def check_alignments(model: Transformer, layer: int | None = None, entry: str | None = None) -> int:
    """The decoder layer (0-based) whose cross-attention gives `model`'s alignments: `layer` (negative counts from
    the end), else the default. SearchError, one line, when the layer does not exist or the mechanism has no
    weights per source position (naming `entry` when given, and why)."""
    n = len(model.decoder.layers)
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n):
        raise SearchError(f"alignment_layer={layer!r}: the decoder has {n} layers; give 0 … {n - 1} (or -1 … -{n})")
    index = default_alignment_layer(n) if layer is None else layer % n
    reason = model.decoder.layers[index].cross_attn.no_step_weights
    if reason:
        who = f"entry {entry!r}" if entry else "this model"
        raise SearchError(
            f"alignments: {who} (attention {model.cfg.attention!r}) has no cross-attention weights to align with: "
            f"{reason}"
        )
    return index


def kept_heads(module: Attention) -> list[int] | None:
    """The heads of `module` whose output is not gated off (positions in the module), None when all are kept."""
    gate = module.head_gate.tolist()
    kept = [h for h, g in enumerate(gate) if g != 0]
    return None if len(kept) == len(gate) else kept


class CrossAttentionWeights:
    """Decoder layer `layer`'s cross-attention weights, averaged over its kept heads, of the newest position of each
    decoder call made inside `recording` (the module docstring). SearchError as `check_alignments`."""

    def __init__(self, model: Transformer, layer: int | None = None, entry: str | None = None) -> None:
        self.layer = check_alignments(model, layer, entry)
        self.module = model.decoder.layers[self.layer].cross_attn
        self.heads = kept_heads(self.module)
        self.last: Tensor | None = None  # [N, S] float32 of the last recorded call

    @contextlib.contextmanager
    def recording(self, fed: int, grouped: bool = False) -> Iterator[None]:
        """Within: decoder calls of `fed` query positions per row; after: `last` holds the newest position's
        weights [N, S] of the last one (rows in the call's order; `grouped`: `newest`'s). The module captures its
        map only meanwhile."""
        saved = self.module.capture
        if "A" not in saved:
            self.module.capture = (*saved, "A")
        try:
            yield
            self.last = self.newest(self.module.captured["A"], fed, grouped)
        finally:
            self.module.capture = saved
            if "A" not in saved:
                self.module.captured.pop("A", None)

    def newest(self, attn: Tensor, fed: int, grouped: bool = False) -> Tensor:
        """A captured map → the newest query position's head average [N, S] float32. The map is [N, H, T, S] for
        a call of T = `fed` positions per row; a one-position step over a cache of one row per *source* captures
        it grouped, [sources, H, G, S] with N = sources × G (zoo.attention.base.per_source_step), and with
        `grouped` the average stays [sources, G, S] (the exported graph's output: the shape arithmetic of the
        flattening cost more per step than the mean; the host's reshape to [N, S] is free)."""
        if self.heads is not None:
            attn = attn[:, self.heads]  # [.., H_kept, .., S]
        if fed == 1:  # mean over heads first: no copy to put the rows in order, [sources, G, S] is row-major already
            mean = attn.float().mean(dim=1)  # [sources, G, S]
            return mean if grouped else mean.flatten(0, 1)  # [N, S]
        return attn[:, :, -1].float().mean(dim=1)  # [N, H, S] -> [N, S]
