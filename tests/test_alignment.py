"""Word alignments: one decoder layer's cross-attention weights per step, averaged over its kept heads, in both
engines (zoo/decoding/alignment.py, the decoder graph's `alignment` output), refused where a mechanism has none or an
export
predates them, and mapped from pieces to words (export/runtime/alignment.py)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import export
from export.pruning import prune, validate_plan
from export.runtime import SearchError
from export.runtime.alignment import align_words, piece_words, token_pieces, word_alignment, word_texts
from export.runtime.generation import padded, translate
from export.runtime.moses_bpe import MosesBPETokenizer
from export.runtime.tokenizer import SentencePieceTokenizer, SharedVocabTokenizer
from tests.convert_testing import PAIRS, train_sentencepiece
from tests.export_testing import TRAINED_ENTRIES, plan_for
from tests.zoo_testing import random_batch, tiny_model
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.convert.marian import marian_vocabulary
from zoo.decoding.alignment import check_alignments, default_alignment_layer
from zoo.decoding.generate import TorchEngine, TorchStep


def _clear_argmax(w: np.ndarray, gap: float = 1e-4) -> np.ndarray:
    """[N] True where a row's largest weight beats its second by more than `gap`: there two computations must
    agree on the argmax."""
    top2 = np.sort(w, axis=-1)[:, -2:]  # [N, 2]
    return top2[:, 1] - top2[:, 0] > gap


def _explicit_mha_weights(model, layer: int, src: torch.Tensor, tgt: torch.Tensor, heads: list[int]) -> torch.Tensor:
    """softmax(q kᵀ / √dh) of decoder layer `layer`'s cross-attention, written out from its projections in a full
    teacher-forced pass, averaged over `heads`: [B, T, S]."""
    module = model.decoder.layers[layer].cross_attn
    seen = {}
    hook = module.register_forward_hook(lambda m, args, kwargs, out: seen.update(x=args[0]), with_kwargs=True)
    try:
        memory, pad = model.encode(src)
        model.decode(tgt, memory, pad)
    finally:
        hook.remove()
    q = module._split(module.q_proj(seen["x"]))  # [B, H, T, dh]
    k = module._split(module.k_proj(memory))  # [B, H, S, dh]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(module.head_dim)).masked_fill(pad[:, None, None, :], -math.inf)
    return scores.softmax(-1)[:, heads].mean(1)  # [B, T, S]


@pytest.mark.parametrize("entry", ["transformer", "mgk_4head", "mixhead_b"])
@torch.inference_mode()
def test_torch_steps_give_the_layer_s_head_averaged_weights_cached_recomputed_and_pruned(entry: str) -> None:
    """TorchStep's `attention` is the chosen layer's cross-attention averaged over its kept heads: the same cached,
    recomputed and (where heads can be removed) with the gated heads physically removed — non-uniform heads, 3 kept
    in the alignment layer — and for mha the explicit softmax(q kᵀ/√dh) of its projections; 0 at source padding."""
    model = tiny_model(entry)
    src, tgt = random_batch()  # [3, 7] with row 0 padded, [3, 6]
    layer, heads = 0, list(range(model.cfg.num_heads))
    models = [model]
    if entry != "mixhead_b":  # Mixhead's heads cannot be removed or gated by a plan
        heads = [0, 1, model.cfg.num_heads - 1]
        plan = validate_plan({**plan_for(model.cfg.num_heads), "decoder.layers.0.cross_attn": heads}, model)
        pruned, gated = prune(model, plan)
        assert pruned.decoder.layers[0].cross_attn.num_heads == 3 and pruned.decoder.layers[1].cross_attn.num_heads == 1
        models = [gated, pruned]
    pad = models[0].encode(src)[1]
    steps = [
        TorchStep(m, m.encode(src)[0], pad, cache, alignment_layer=layer) for m in models for cache in (True, False)
    ]
    reference = _explicit_mha_weights(models[0], layer, src, tgt, heads) if entry == "transformer" else None
    for t in range(tgt.shape[1]):
        got = []
        for step in steps:
            step(tgt[:, t].numpy(), t, 4)
            assert step.attention is not None and step.attention.shape == (3, 7) and step.attention.dtype == np.float32
            got.append(step.attention)
        for other in got[1:]:
            assert np.abs(other - got[0]).max() < 1e-5, t
        assert np.all(got[0][0, -2:] == 0.0)  # source padding
        assert np.allclose(got[0].sum(-1), 1.0, atol=1e-5)  # a mean of distributions (Mixhead's identity init)
        if reference is not None:
            assert np.abs(got[0] - reference[:, t].numpy()).max() < 1e-5
            clear = _clear_argmax(got[0])
            assert clear.any() and np.array_equal(got[0].argmax(-1)[clear], reference[:, t].argmax(-1).numpy()[clear])


def test_the_layer_is_the_penultimate_unless_chosen_and_linear_attention_is_refused() -> None:
    assert [default_alignment_layer(n) for n in (1, 2, 3, 6)] == [0, 0, 1, 4]
    model = tiny_model("transformer")  # 2 decoder layers
    assert check_alignments(model) == 0 and check_alignments(model, -1) == 1
    with pytest.raises(SearchError, match=r"alignment_layer=2: the decoder has 2 layers; give 0 … 1"):
        check_alignments(model, 2)
    for entry, key in (("linear_8head", "linear"), ("mlk_4head", "mlk")):
        linear = tiny_model(entry)
        memory, pad = linear.encode(random_batch()[0])
        with pytest.raises(SearchError, match=rf"^alignments: this model \(attention '{key}'\) .*running sums[^\n]*$"):
            TorchStep(linear, memory, pad, True, alignment_layer=0)
        with pytest.raises(SearchError, match=rf"entry '{entry}' \(attention '{key}'\)"):
            check_alignments(linear, None, entry)


@pytest.mark.parametrize("entry", TRAINED_ENTRIES)
def test_the_graph_s_alignment_output_equals_torch_s_weights_at_every_step(entry: str, exported, smoke_run) -> None:
    """The exported decoder's `alignment` (pruned or gated heads: the test plan, GHT-PS's voted one) equals the
    torch step's weights of the manifest's layer at every step of a beam-like walk (beams reordered, sentences
    leaving), and their argmax where it is clear; a stepper without alignments does not fetch the output."""
    out, manifest = exported(entry)
    info = manifest["alignment"]
    plan = manifest["head_plan"]
    every = list(range(manifest["model_config"]["num_heads"]))
    assert info["output"] == "alignment" and info["layer"] == 0 and info["reason"] is None
    assert info["heads"] == plan.get("decoder.layers.0.cross_attn", every)
    assert manifest["verification"]["max_abs_alignment_diff"] <= 1e-5
    _, reference = prune(model_from_checkpoint(load_checkpoint(smoke_run(entry))), plan, remove=False)
    runtime = export.load(out, threads=1)
    texts = [s for s, _ in PAIRS[:5]]
    src = padded(runtime.encode_texts(texts), runtime.pad_id)  # [B, S]
    rows = np.repeat(np.arange(len(src)), 2)  # two rows per sentence, as a beam of 2
    fetched: list[list[str]] = []
    decode = runtime.backend.decode
    runtime.backend.decode = lambda names, feeds: fetched.append(names) or decode(names, feeds)  # type: ignore[method-assign]
    plain = runtime.stepper(runtime.encode(src), rows, steps=8)
    ort_step = runtime.stepper(runtime.encode(src), rows, steps=8, alignments=True)
    with torch.inference_mode():
        memory, pad_mask = reference.encode(torch.from_numpy(src))
        order = torch.from_numpy(rows)
        torch_step = TorchStep(reference, memory[order], pad_mask[order], True, alignment_layer=runtime.alignment_layer)
        rng = np.random.default_rng(0)
        last = np.full(len(rows), reference.cfg.bos_id, dtype=np.int64)
        clear = 0
        for t in range(6):
            plain(last, t, 4)
            _, tok = ort_step(last, t, 4)
            torch_step(last, t, 4)
            got, want = ort_step.attention, torch_step.attention
            assert got is not None and want is not None and got.shape == want.shape == (len(last), src.shape[1])
            assert np.abs(got - want).max() <= 1e-5, t
            assert np.all(got[src[ort_step.sentence] == runtime.pad_id] == 0.0)  # source padding
            sure = _clear_argmax(want)
            assert np.array_equal(got.argmax(-1)[sure], want.argmax(-1)[sure])
            clear += sure.sum()
            sentences = np.arange(len(last) // 2)
            if t % 2 and len(sentences) > 1:
                sentences = np.delete(sentences, rng.integers(len(sentences)))  # a sentence finished: it leaves
            keep = np.concatenate([np.sort(rng.choice([2 * s, 2 * s + 1], 2)) for s in sentences])
            for step in (plain, ort_step, torch_step):
                step.select(keep)
            last = tok[keep, 0]
    assert clear > 10  # the argmax was compared on most rows, not skipped as ties
    assert [("alignment" in names) for names in fetched] == [False, True] * 6


def test_exports_without_an_alignment_output_refuse_alignments_naming_the_fix(exported, tmp_path: Path) -> None:
    """An export made before alignments (no manifest key, no output) still decodes, and asking it for alignments
    is one line saying to re-export; one whose mechanism has none says why; a malformed entry is refused on load."""
    out, _ = exported("transformer")
    old = tmp_path / "old"
    shutil.copytree(out, old)
    path = old / "manifest.json"
    manifest = json.loads(path.read_text())

    def load_with(alignment: object, outputs: list[str]) -> export.ExportedModel:
        edited = {**manifest, "graphs": {**manifest["graphs"], "decoder": {**manifest["graphs"]["decoder"]}}}
        edited["graphs"]["decoder"]["outputs"] = outputs
        edited.pop("alignment")
        if alignment is not None:
            edited["alignment"] = alignment
        path.write_text(json.dumps(edited))
        return export.load(old, threads=1)

    outputs = [o for o in manifest["graphs"]["decoder"]["outputs"] if o != "alignment"]
    model = load_with(None, outputs)
    assert model.translate(["Guten Morgen."]) == export.load(out, threads=1).translate(["Guten Morgen."])
    encoded = model.encode(padded(model.encode_texts(["Guten Morgen."]), model.pad_id))
    with pytest.raises(SearchError, match=r"^return_alignments: transformer-smoke was exported without .* re-export"):
        model.stepper(encoded, alignments=True)
    none = {"output": None, "layer": None, "heads": [], "reason": "attention 'linear': running sums"}
    with pytest.raises(SearchError, match=r"^return_alignments: transformer-smoke has no .*: attention 'linear': runn"):
        load_with(none, outputs).stepper(encoded, alignments=True)
    with pytest.raises(export.ExportedModelError, match=r"alignment\.layer=-1 is out of range"):
        load_with({**manifest["alignment"], "layer": -1}, manifest["graphs"]["decoder"]["outputs"])


def test_pieces_map_to_words_for_sentencepiece_and_moses_bpe() -> None:
    # sentencepiece: ▁ starts a word; text BPE-split before it (`@@` pieces) continues one; specials in no word
    assert piece_words(["▁Das", "▁Wunder", "land", ",", "▁ja"]).tolist() == [0, 1, 1, 1, 2]
    assert piece_words(["▁ver", "@@", "▁stand", "▁ist", "</s>"], [False] * 4 + [True]).tolist() == [0, 0, 0, 1, -1]
    # BPE: `</w>` ends a word (FSMT), or `@@` continues one (subword-nmt)
    assert piece_words(["ver", "stand</w>", "en</w>"], scheme="bpe").tolist() == [0, 0, 1]
    assert piece_words(["ver@@", "stand", "en", "ist"], scheme="bpe").tolist() == [0, 0, 1, 2]
    assert word_texts(["ver@@", "stand", "en"], np.array([0, 0, 1])) == ["verstand", "en"]
    assert word_alignment([0, 2, 1, 3], np.array([0, 0, 1, -1]), np.array([0, 1, 1])) == [(0, 0), (0, 1), (1, 1)]

    source, target = train_sentencepiece([s for s, _ in PAIRS], 60), train_sentencepiece([t for _, t in PAIRS], 60, 1)
    joint = SentencePieceTokenizer(target)  # as zoo.train's: no eos on sources
    for text in (t for _, t in PAIRS[:4]):
        [ids] = joint.encode_sources([text])
        pieces, special = token_pieces(joint, ids, "source")
        assert word_texts(pieces, piece_words(pieces, special)) == text.split()
    marian = SharedVocabTokenizer(source, target, [*marian_vocabulary(source, target), ">>en<<"])
    [ids] = marian.encode_sources([">>en<< " + PAIRS[0][0]])  # a language code first and eos last: in no word
    pieces, special = token_pieces(marian, ids, "source")
    words = piece_words(pieces, special)
    assert words[0] == words[-1] == -1 and word_texts(pieces, words) == PAIRS[0][0].split()

    chars = sorted(set("Das Haus,ja."))
    vocab = ["<s>", "<pad>", "</s>", "<unk>", *chars, *[c + "</w>" for c in chars], "Hau"]
    moses = MosesBPETokenizer(vocab, vocab, [("H", "a"), ("Ha", "u")], "de", "en")
    [src] = moses.encode_sources(["Das Haus, ja."])  # Moses tokens Das | Haus | , | ja | .  then eos
    pieces, special = token_pieces(moses, src, "source")
    words = piece_words(pieces, special, scheme="bpe")
    assert word_texts(pieces, words) == ["Das", "Haus", ",", "ja", "."] and words[-1] == -1
    [tgt] = moses.encode_targets(["ja Haus"])  # pieces j a</w> Hau s</w>
    positions = [6, 7, 3, 4, 9]  # j a → j a; Hau s → Hau s of Haus; the eos step's position ignored
    assert align_words(moses, src, tgt, positions) == [(1, 1), (3, 0)]


@pytest.mark.parametrize("beam", [1, 4])
def test_a_searched_hypothesis_carries_the_argmax_of_its_steps_weights(beam: int, exported, smoke_run) -> None:
    """translate(return_alignments=True), beam 4 and greedy, a target prefix included: every hypothesis' alignment
    has one source position per token, equal in both engines, and equal — where the weights' argmax is clear — to
    the argmax of the torch weights of teacher-forcing that hypothesis (its steps' attention, recomputed apart)."""
    out, manifest = exported("transformer")
    runtime = export.load(out, threads=1)
    reference = prune(
        model_from_checkpoint(load_checkpoint(smoke_run("transformer"))), manifest["head_plan"], remove=False
    )[1]
    texts = [s for s, _ in PAIRS[:6]]
    prefix = ["", "", "", "", "", texts[5].split()[0]]
    search = {"beam_size": beam, "num_hypotheses": min(beam, 2), "target_prefix": prefix}
    ours = runtime.translate(texts, return_alignments=True, **search)
    src = padded(runtime.encode_texts(texts), runtime.pad_id)
    engine = TorchEngine(reference, runtime.tokenizer, alignment_layer=runtime.alignment_layer)
    asked = export.Search(beam_size=beam, num_hypotheses=min(beam, 2), return_alignments=True)
    theirs = translate(engine, texts, asked, prefix)  # the same driver over the torch model
    compared = 0
    for i, (hyps, twins) in enumerate(zip(ours, theirs, strict=True)):
        for h, twin in zip(hyps, twins, strict=True):
            assert h.tokens == twin.tokens and len(h.alignment) == len(h.tokens) == len(twin.alignment)
            with torch.inference_mode():
                memory, pad = reference.encode(torch.from_numpy(src[i : i + 1]))
                step = TorchStep(reference, memory, pad, False, alignment_layer=runtime.alignment_layer)
                walk = []
                for t, token in enumerate([reference.cfg.bos_id, *h.tokens[:-1]] if h.tokens else []):
                    step(np.array([token]), t, 4)
                    walk.append(step.attention[0])
            if not walk:
                continue
            weights = np.stack(walk)  # [T, S]
            sure = _clear_argmax(weights)
            assert np.array_equal(np.array(h.alignment)[sure], weights.argmax(-1)[sure])
            assert np.array_equal(np.array(twin.alignment)[sure], weights.argmax(-1)[sure])
            assert all(0 <= a < src.shape[1] for a in h.alignment)
            compared += int(sure.sum())
    assert compared > 20
