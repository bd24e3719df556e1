"""`python -m zoo.convert --from fsmt`: parity with transformers on a WMT19-like random-init FSMT model (ReLU,
scaled embeddings, fairseq's positions from pad + 1, separate source and target vocabularies of different sizes, an
output projection of its own, decoding from eos) whose Moses + BPE tokenizer is made from merges learned in the test;
the export, pruned and served; configs the zoo cannot represent exactly refused, naming the field, nothing written.

transformers is the reference here (the `[hf]` extra, part of `dev`); the converter itself does not import it.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import export
from export.exporter import ExportError, export_checkpoint
from export.runtime.generation import best_tokens
from export.runtime.moses_bpe import MosesBPETokenizer, merge_pair
from export.runtime.search import Search
from tests.convert_testing import (
    PAIRS,
    assert_refused,
    assert_served_equals_runtime,
    edit_config,
    edit_weights,
    generate_like_the_zoo,
)
from tests.export_testing import export_config
from tests.zoo_testing import compose_train
from zoo.checkpoint import load_checkpoint, model_from_checkpoint
from zoo.convert.__main__ import main as convert_main
from zoo.data import load_tokenizer
from zoo.decoding.generate import generate as generate_nbest
from zoo.train import train

transformers = pytest.importorskip("transformers", reason="the parity tests need the [hf] extra (part of dev)")
sacremoses = pytest.importorskip("sacremoses", reason="FSMT's tokenizer needs sacremoses (a dependency)")

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # fairseq's dictionary: bos 0, pad 1, eos 2, unk 3
MERGES = 60
MAX_NEW = 20


def _words(texts: list[str], lang: str) -> list[str]:
    moses = sacremoses.MosesTokenizer(lang=lang)
    return [w for t in texts for w in moses.tokenize(t, aggressive_dash_splits=True, return_str=False, escape=True)]


def learn_merges(words: list[str], count: int) -> list[tuple[str, str]]:
    """BPE as subword-nmt learns it: words as characters with `</w>` on the last, the most frequent adjacent pair
    merged `count` times (ties: the larger pair, so the result is fixed)."""
    vocab = Counter(tuple(w[:-1]) + (w[-1] + "</w>",) for w in words)
    merges = []
    for _ in range(count):
        pairs: Counter = Counter()
        for word, n in vocab.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += n
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        merged: Counter = Counter()
        for word, n in vocab.items():
            merged[tuple(merge_pair(word, best))] += n
        vocab = merged
    return merges


def write_fsmt_directory(directory: Path, tied: bool) -> tuple[object, object]:
    """A save_pretrained directory of a tiny random-init FSMTForConditionalGeneration and its FSMTTokenizer; (model,
    tokenizer). Untied: separate vocabularies of different sizes (every source piece starting with "z" left out, so
    sources meet unk) and an output projection of its own; tied: one vocabulary and one table for all three."""
    de, en = _words([s for s, _ in PAIRS], "de"), _words([t for _, t in PAIRS], "en")
    merges = learn_merges(de + en, MERGES)
    splitter = MosesBPETokenizer(SPECIALS, SPECIALS, merges, "de", "en")  # its bpe() only: the pieces to list
    source = sorted({p for w in de for p in splitter.bpe(w)} - {p for w in de for p in splitter.bpe(w) if p[0] == "z"})
    target = sorted({p for w in en for p in splitter.bpe(w)})
    if tied:
        source = target = sorted({*source, *target})
    for name, pieces in (("vocab-src.json", source), ("vocab-tgt.json", target)):
        (directory / name).write_text(json.dumps({p: i for i, p in enumerate(SPECIALS + pieces)}, ensure_ascii=False))
    (directory / "merges.txt").write_text("".join(f"{a} {b} 1\n" for a, b in merges))
    tok = transformers.FSMTTokenizer(
        langs=["de", "en"],
        src_vocab_file=str(directory / "vocab-src.json"),
        tgt_vocab_file=str(directory / "vocab-tgt.json"),
        merges_file=str(directory / "merges.txt"),
    )
    tok.save_pretrained(directory)
    config = transformers.FSMTConfig(
        langs=["de", "en"],
        src_vocab_size=len(SPECIALS + source),
        tgt_vocab_size=len(SPECIALS + target),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
        init_std=0.3,  # peaked next-token distributions: no near-ties for the searches to break differently
    )
    torch.manual_seed(0)
    model = transformers.FSMTForConditionalGeneration(config).eval()
    with torch.no_grad():  # non-zero biases and layer norms: every weight the conversion maps changes the output
        for name, p in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(directory)
    return model, tok


@pytest.fixture(scope="module")
def fsmt(tmp_path_factory) -> tuple[Path, object, object]:
    """(save_pretrained directory, the transformers model, its FSMTTokenizer): separate vocabularies, untied."""
    directory = tmp_path_factory.mktemp("wmt19-de-en")
    return directory, *write_fsmt_directory(directory, tied=False)


def _convert(directory: Path, out: Path, *extra: str) -> Path:
    assert convert_main(["--from", "fsmt", str(directory), "--out", str(out), *extra]) == 0
    return out


@pytest.fixture(scope="module")
def converted(fsmt, tmp_path_factory) -> Path:
    heldout = tmp_path_factory.mktemp("heldout")
    (heldout / "src").write_text("\n".join(s for s, _ in PAIRS) + "\n")
    (heldout / "tgt").write_text("\n".join(t for _, t in PAIRS) + "\n")
    out = tmp_path_factory.mktemp("converted") / "wmt.pt"
    return _convert(fsmt[0], out, "--heldout", str(heldout / "src"), str(heldout / "tgt"))


def test_checkpoint_is_self_contained(fsmt, converted: Path) -> None:
    _, hf_model, _ = fsmt
    payload = load_checkpoint(converted)
    cfg = payload["model_config"]
    assert (cfg["vocab_size"], cfg["source_vocab_size"]) == (
        hf_model.config.tgt_vocab_size,
        hf_model.config.src_vocab_size,
    )
    assert cfg["vocab_size"] != cfg["source_vocab_size"] and not cfg["share_all_embeddings"]
    assert not cfg["share_decoder_embeddings"]  # the output projection is its own
    assert (cfg["activation"], cfg["positions"], cfg["position_offset"], cfg["final_logits_bias"]) == (
        "relu",
        "fairseq",
        2,  # pad + 1
        False,
    )
    assert cfg["bos_id"] == cfg["eos_id"] == 2 and payload["converted_from"]["format"] == "fsmt"
    assert isinstance(load_tokenizer(payload["tokenizer"]), MosesBPETokenizer)
    assert payload["generation"] == {"beam_size": 5, "len_penalty": 1.0}  # FSMTConfig's own defaults


def test_tokenizer_equals_fsmt_tokenizer(fsmt, converted: Path) -> None:
    """Sources as FSMTTokenizer encodes them (eos appended, unk where the source vocabulary lacks a piece);
    targets as the reverse direction's FSMTTokenizer encodes them (FSMTTokenizer encodes only its source
    language); output ids decoded as FSMTTokenizer decodes them."""
    directory, _, hf_tok = fsmt
    tok = load_tokenizer(load_checkpoint(converted)["tokenizer"])
    sources, targets = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    encoded = tok.encode_sources(sources)
    assert encoded == hf_tok(sources)["input_ids"]
    assert any(tok.unk_id in ids for ids in encoded)
    reverse = transformers.FSMTTokenizer(
        langs=["en", "de"],
        src_vocab_file=str(directory / "vocab-tgt.json"),
        tgt_vocab_file=str(directory / "vocab-src.json"),
        merges_file=str(directory / "merges.txt"),
    )
    ids = tok.encode_targets(targets)
    assert [[*i, tok.eos_id] for i in ids] == reverse(targets)["input_ids"]
    assert [tok.decode(i) for i in ids] == hf_tok.batch_decode(ids, skip_special_tokens=True)
    assert tok.decode(ids[0]) == "The house is small."  # Moses-detokenised


def test_logits_equal_transformers(fsmt, converted: Path) -> None:
    """Teacher-forced logits of a padded batch, every non-padding position, to 1e-4. transformers' side runs with
    use_cache=False: with its cache on, FSMT in transformers 5.24 gives a teacher-forced batch other logits than
    its own step-by-step decoding (which test_greedy_and_beam_equal_generate compares)."""
    _, hf_model, hf_tok = fsmt
    model = model_from_checkpoint(load_checkpoint(converted))
    tok = load_tokenizer(load_checkpoint(converted)["tokenizer"])
    enc = hf_tok([s for s, _ in PAIRS], return_tensors="pt", padding=True)
    ids = tok.encode_targets([t for _, t in PAIRS])
    width = max(map(len, ids)) + 1
    decoder_in = torch.full((len(ids), width), tok.pad_id)  # [B, T]: eos, then the target
    keep = torch.zeros(len(ids), width, dtype=torch.bool)
    for row, target in enumerate(ids):
        decoder_in[row, : len(target) + 1] = torch.tensor([tok.eos_id, *target])
        keep[row, : len(target) + 1] = True
    with torch.no_grad():
        theirs = hf_model(**enc, decoder_input_ids=decoder_in, use_cache=False).logits
        ours = model(enc["input_ids"], decoder_in)
    assert float((theirs - ours)[keep].abs().max()) <= 1e-4


@pytest.mark.parametrize("beam", [1, 4])
def test_greedy_and_beam_equal_generate(fsmt, converted: Path, beam: int) -> None:
    """The zoo's search equals generate() with the same settings: decoding from eos, which still ends a
    hypothesis (only pad is banned), eos banned before the first token and forced at the limit, length penalty 1,
    a sentence done when `beam` hypotheses finished; the beam's best hypothesis and its score too."""
    _, hf_model, hf_tok = fsmt
    model = model_from_checkpoint(load_checkpoint(converted))
    enc = hf_tok([s for s, _ in PAIRS], return_tensors="pt", padding=True)
    theirs, out = generate_like_the_zoo(hf_model, enc, beam, MAX_NEW)
    search = Search(beam_size=beam, len_penalty=1.0, max_len_a=0, max_len_b=MAX_NEW, min_len=1)
    best = [hyps[0] for hyps in generate_nbest(model, enc["input_ids"], search)]
    assert [h.tokens for h in best] == theirs == best_tokens(generate_nbest(model, enc["input_ids"], search))
    lengths = {len(h.tokens) for h in best}
    assert min(lengths) < MAX_NEW - 1 and max(lengths) == MAX_NEW - 1  # natural and forced ends both compared
    if beam > 1:
        np.testing.assert_allclose([h.score for h in best], out.sequences_scores.numpy(), atol=1e-4)


def test_tied_model_converts_to_one_table(tmp_path: Path) -> None:
    """tie_word_embeddings=True (one vocabulary; transformers saves the shared table once): one embedding for the
    encoder, the decoder and the output projection, and the logits equal transformers'."""
    directory = tmp_path / "tied"
    directory.mkdir()
    hf_model, hf_tok = write_fsmt_directory(directory, tied=True)
    out = _convert(directory, tmp_path / "tied.pt")
    cfg = load_checkpoint(out)["model_config"]
    assert cfg["share_all_embeddings"] and cfg["source_vocab_size"] is None
    model = model_from_checkpoint(load_checkpoint(out))
    assert model.src_embed is model.tgt_embed and model.output_proj is None
    enc = hf_tok([s for s, _ in PAIRS[:4]], return_tensors="pt", padding=True)
    decoder_in = torch.tensor([[2, 7, 9, 11]] * 4)
    with torch.no_grad():
        theirs = hf_model(**enc, decoder_input_ids=decoder_in, use_cache=False).logits
        assert float((theirs - model(enc["input_ids"], decoder_in)).abs().max()) <= 1e-4


REFUSED = {
    "model_type": (lambda d: edit_config(d, model_type="marian"), "model_type='marian' (not an FSMT model)"),
    "langs": (lambda d: edit_config(d, langs=["en", "de"]), "langs=['en', 'de']"),
    "decoder_start": (lambda d: edit_config(d, decoder_start_token_id=1), "decoder_start_token_id=1"),
    "src_vocab_size": (lambda d: edit_config(d, src_vocab_size=7), "src_vocab_size=7 (vocab-src.json has"),
    "decoder_heads": (lambda d: edit_config(d, decoder_attention_heads=2), "decoder_attention_heads=2"),
    "activation": (lambda d: edit_config(d, activation_function="gelu_new"), "activation_function='gelu_new'"),
    "merges": (lambda d: (d / "merges.txt").unlink(), "merges.txt is missing"),
    "learned_positions": (
        lambda d: edit_weights(d, lambda s: s.update({"model.encoder.embed_positions.weight": torch.randn(67, 32)})),
        "weight 'model.encoder.embed_positions.weight' is not fairseq's sinusoidal position table",
    ),
    "extra_weight": (
        lambda d: edit_weights(d, lambda s: s.update({"model.encoder.layernorm_embedding.weight": torch.ones(32)})),
        "weight 'model.encoder.layernorm_embedding.weight' has no counterpart",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unrepresentable_configs_are_refused(fsmt, tmp_path: Path, capsys, case: str) -> None:
    """One line on stderr naming the field (or weight or file), exit status 2, and no checkpoint written."""
    assert_refused("fsmt", fsmt[0], tmp_path, capsys, *REFUSED[case])


def test_fine_tunes_from_the_converted_model(converted: Path, smoke_corpus: Path, tmp_path: Path) -> None:
    """`zoo.train +model=transformer init=<converted FSMT>`: the corpus encoded with Moses + BPE into the two
    vocabularies, the architecture kept (separate source vocabulary, positions from pad + 1, decoding from eos),
    weights changed by training, and the evaluation decodes with it."""
    source = load_checkpoint(converted)
    overrides = ["+model=transformer", "trainer=smoke", "data=files", "data.name=smoke", "data.max_len=60"]
    overrides += ["trainer.max_updates=4", "trainer.validate_every=4", "trainer.max_tokens=1024"]
    overrides += [f"init={converted}", f"data.path={smoke_corpus}", f"runs_root={tmp_path}"]
    summary = train(compose_train(overrides))
    run = Path(summary["run_dir"])
    assert (run / "tokenizer.model").read_bytes() == source["tokenizer"]
    last = load_checkpoint(run / "checkpoints" / "last.pt")
    assert last["model_config"] == source["model_config"] and last["train_state"]["step"] == 4
    name = "decoder.layers.0.ffn.fc1.weight"
    assert not torch.equal(last["model"][name], source["model"][name])
    assert summary["test"]["bleu"] >= 0 and (run / "test_hypotheses.txt").read_text().strip()


def test_shortlist_needs_one_vocabulary(converted: Path, tmp_path: Path) -> None:
    """A vocabulary shortlist maps source ids to target ids of one table: refused for separate vocabularies, with
    the sizes and the fix, before anything is exported."""
    cfg = export_config(converted, tmp_path / "out", "shortlist.build=true")
    with pytest.raises(ExportError, match=r"separate ones \(source \d+, target \d+ ids\): export without a shortlist"):
        export_checkpoint(cfg)
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def pruned(converted: Path, tmp_path_factory) -> tuple[Path, dict]:
    """(export directory, manifest) of `python -m export checkpoint=<converted> keep_heads=2`."""
    out = tmp_path_factory.mktemp("pruned") / "export"
    return out, export_checkpoint(export_config(converted, out, "keep_heads=2", "verify.sentences=8"))


def test_export_prunes_heads_and_verifies(fsmt, pruned: tuple[Path, dict]) -> None:
    """keep_heads=2 on the converted model: 2 of 4 heads per module removed physically, the export verified (ORT =
    torch, identical greedy and beam hypotheses), its runtime tokenizer FSMT's, its translations the converted
    PyTorch model's texts."""
    out, manifest = pruned
    assert manifest["verification"]["passed"], json.dumps(manifest["verification"])[:2000]
    assert all(h["num_heads"] == 2 for h in manifest["heads"].values()) and manifest["heads_removed"]
    runtime = export.load(out, threads=1)
    assert isinstance(runtime.tokenizer, MosesBPETokenizer)
    texts = runtime.translate([s for s, _ in PAIRS[:4]], beam_size=2)
    assert len(texts) == 4 and all(isinstance(t, str) for t in texts)


def test_served_pruned_model_equals_the_runtime(pruned: tuple[Path, dict], tmp_path: Path) -> None:
    """serve.repository + serve.start + the client: the pruned converted FSMT model served by Triton (Python backend,
    Moses + BPE inside it) returns the in-process runtime's texts, one request at a time."""
    out, manifest = pruned
    assert_served_equals_runtime(out, manifest, [s for s, _ in PAIRS[:4]], tmp_path)
