"""The ModelConfig options a converted pretrained model needs (zoo.convert), each against its reference written
from the formula, and all of them at once through the export and the torch-free runtime: FFN activation, Marian's
position table, embedding scale, the final logits bias, pad or eos as the decoder's start token, a position table
starting at a later row, a separate source vocabulary, and source and target sentencepiece models sharing one
vocabulary (FSMT's Moses + BPE tokenizer: tests/test_convert_fsmt.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import export
from export.exporter import export_checkpoint
from export.runtime.errors import ExportedModelError
from export.runtime.generation import best_tokens
from export.runtime.search import Search
from export.runtime.tokenizer import SharedVocabTokenizer, load_tokenizer
from tests.convert_testing import PAIRS, marian_tokenizer
from tests.export_testing import export_config
from zoo.api import Translator
from zoo.checkpoint import load_checkpoint, model_from_checkpoint, save_checkpoint
from zoo.data import DataError
from zoo.data import load_tokenizer as zoo_load_tokenizer
from zoo.decoding.generate import generate as torch_generate
from zoo.decoding.generate import score_targets
from zoo.model import FeedForward, ModelConfig, build_model, marian_positions, sinusoidal_positions


def generate(model, src: torch.Tensor, search: Search, use_cache: bool = True) -> list[list[int]]:
    return best_tokens(torch_generate(model, src, search, use_cache=use_cache))


TINY = dict(d_model=16, encoder_layers=2, decoder_layers=2, num_heads=4, ffn_dim=32, dropout=0.0, max_positions=64)


@pytest.mark.parametrize(
    ("activation", "reference"),
    [
        ("relu", lambda h: h.clamp(min=0)),
        ("swish", lambda h: h / (1 + torch.exp(-h))),
        ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))),
    ],
)
def test_ffn_activation_is_its_formula(activation: str, reference) -> None:
    torch.manual_seed(0)
    ffn = FeedForward(8, 16, 0.0, activation)
    x = torch.randn(2, 3, 8)
    expected = ffn.fc2(reference(ffn.fc1(x)))  # [2, 3, 8]
    torch.testing.assert_close(ffn(x), expected, rtol=0, atol=1e-6)


def test_unknown_options_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"activation='tanh' is not supported; use one of relu, swish, gelu"):
        ModelConfig(vocab_size=8, activation="tanh")
    with pytest.raises(ValueError, match=r"positions='learned'"):
        ModelConfig(vocab_size=8, positions="learned")


@pytest.mark.parametrize("dim", [16, 7])
def test_marian_position_table_is_its_formula(dim: int) -> None:
    """Marian's table (transformers' MarianSinusoidalPositionalEmbedding): angle pos / 10000^(2⌊j/2⌋/dim) of column
    j; sin of the even columns' angles first, cos of the odd columns' after them."""
    table = marian_positions(30, dim)
    angle = [[pos / 10000 ** (2 * (j // 2) / dim) for j in range(dim)] for pos in range(30)]
    expected = [[math.sin(a) for a in row[0::2]] + [math.cos(a) for a in row[1::2]] for row in angle]
    torch.testing.assert_close(table, torch.tensor(expected, dtype=torch.float32), rtol=0, atol=1e-6)
    # fairseq's (the zoo's own) differs: its frequencies step by ln 10⁴ / (dim/2 - 1)
    assert not torch.allclose(table[1:], sinusoidal_positions(30, dim)[1:], atol=1e-3)


def test_default_config_keeps_the_zoo_architecture() -> None:
    cfg = ModelConfig(vocab_size=40, **TINY)
    model = build_model(cfg)
    options = (cfg.activation, cfg.scale_embedding, cfg.positions, cfg.final_logits_bias)
    assert options == ("relu", True, "fairseq", False)
    assert model.embed_scale == math.sqrt(16) and model.final_logits_bias is None
    assert "final_logits_bias" not in model.state_dict()  # checkpoints written before the option still load
    torch.testing.assert_close(model.positions, sinusoidal_positions(65, 16))
    old = ModelConfig.from_dict({k: v for k, v in cfg.to_dict().items() if k not in ("activation", "positions")})
    assert old == cfg


def test_embedding_scale_and_final_logits_bias() -> None:
    """scale_embedding=False feeds the embedding rows as they are: the encoder then equals a default model's whose
    embedding is divided by √d. The final logits bias adds to every position's logits, and is saved."""
    torch.manual_seed(0)
    plain = build_model(ModelConfig(vocab_size=40, **TINY, scale_embedding=False, final_logits_bias=True)).eval()
    scaled = build_model(ModelConfig(vocab_size=40, **TINY)).eval()
    state = {k: v for k, v in plain.state_dict().items() if k != "final_logits_bias"}
    state["src_embed.weight"] = state["src_embed.weight"] / math.sqrt(16)
    state["tgt_embed.weight"] = state["tgt_embed.weight"] / math.sqrt(16)
    scaled.load_state_dict(state)
    src = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    tgt = torch.tensor([[2, 11, 12], [2, 13, 14]])
    torch.testing.assert_close(plain.encode(src)[0], scaled.encode(src)[0], rtol=0, atol=1e-5)

    before = plain(src, tgt)  # [B, T, V]
    bias = torch.randn(40)
    plain.final_logits_bias.copy_(bias)
    torch.testing.assert_close(plain(src, tgt), before + bias, rtol=0, atol=1e-5)
    assert torch.equal(plain.state_dict()["final_logits_bias"], bias)


def _reference_greedy(model, src: torch.Tensor, steps: int) -> list[int]:
    """Greedy decoding from the definition for one source [1, S]: start from the decoder's start token (pad or eos
    here: neither is banned beyond pad), recompute the whole prefix, ban pad, eos banned at the first step (min_len
    1), stop at eos."""
    cfg = model.cfg
    tokens = [cfg.bos_id]  # the decoder's start token
    memory, pad = model.encode(src)
    for t in range(steps):
        lprobs = model.decode(torch.tensor([tokens]), memory, pad)[0, -1].log_softmax(-1)
        lprobs[cfg.pad_id] = -math.inf
        if t == 0:
            lprobs[cfg.eos_id] = -math.inf
        nxt = int(lprobs.argmax())
        if nxt == cfg.eos_id:
            break
        tokens.append(nxt)
    return tokens[1:]


def _searches_follow_the_definition(model, src: torch.Tensor) -> list[list[int]]:
    """Greedy search equals the definition's for every source of src [B, S] (padding cut), the cached searches
    equal the recomputing ones, and scoring feeds the start token first; the greedy outputs."""
    cfg = model.cfg
    search = Search(beam_size=1, max_len_a=0, max_len_b=12)
    got = generate(model, src, search)
    lengths = src.ne(cfg.pad_id).sum(1).tolist()
    assert got == [_reference_greedy(model, src[i : i + 1, : lengths[i]], 11) for i in range(len(src))]
    assert got == generate(model, src, search, use_cache=False)
    beam = Search(beam_size=3, max_len_a=0, max_len_b=12)
    assert generate(model, src, beam) == generate(model, src, beam, use_cache=False)
    scored = score_targets(model, src[:1], [[11, 12]])[0]
    with torch.no_grad():
        memory, pad = model.encode(src[:1])
        expected = model.decode(torch.tensor([[cfg.bos_id, 11, 12]]), memory, pad)[0].log_softmax(-1)  # [3, V]
    assert scored.tokens == [11, 12, cfg.eos_id]
    reference = [float(expected[i, t]) for i, t in enumerate(scored.tokens)]
    np.testing.assert_allclose(scored.token_logprobs, reference, atol=1e-5)
    return got


def test_pad_as_decoder_start() -> None:
    """A model whose decoder starts from pad (bos_id == pad_id, Marian) searches and scores by the definition."""
    torch.manual_seed(3)
    cfg = ModelConfig(vocab_size=40, **TINY, pad_id=39, bos_id=39, eos_id=0, activation="swish", positions="marian")
    _searches_follow_the_definition(build_model(cfg).eval(), torch.tensor([[5, 6, 7, 8, 0], [9, 10, 11, 0, 39]]))


def test_eos_as_decoder_start() -> None:
    """A model whose decoder starts from eos (bos_id == eos_id, fairseq's FSMT) searches and scores by the
    definition, and eos still ends a hypothesis: some greedy outputs end themselves."""
    torch.manual_seed(5)
    model = build_model(ModelConfig(vocab_size=40, **TINY, pad_id=1, bos_id=2, eos_id=2, position_offset=2)).eval()
    with torch.no_grad():  # eos leaning on a direction the last layer adds to every state: some outputs end early
        direction = torch.randn(16)
        model.decoder.layers[-1].ffn_block.norm.bias.copy_(direction)
        model.tgt_embed.weight[2] += 0.15 * direction
    got = _searches_follow_the_definition(model, torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 1], [12, 2, 1, 1, 1]]))
    assert sorted(map(len, got)) == [1, 1, 11]  # natural ends (eos is not banned as the start token) and a forced one


@pytest.mark.parametrize("offset", [0, 2])
def test_position_offset_starts_the_table_later(offset: int) -> None:
    """position_offset=k: position p reads row p + k of fairseq's table (FSMT counts positions from pad + 1):
    sin(p'·f_i) on the first half, cos(p'·f_i) on the second, f_i = exp(-i·ln 10⁴ / (d/2 - 1)), p' = p + k."""
    model = build_model(ModelConfig(vocab_size=40, **TINY, position_offset=offset))
    half = 8
    freq = [math.exp(-i * math.log(10000) / (half - 1)) for i in range(half)]
    expected = [
        [math.sin((p + offset) * f) for f in freq] + [math.cos((p + offset) * f) for f in freq] for p in range(65)
    ]
    torch.testing.assert_close(model.positions, torch.tensor(expected), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="position_offset=-1 must be >= 0"):
        ModelConfig(vocab_size=40, position_offset=-1)


def test_separate_source_vocabulary() -> None:
    """source_vocab_size: the encoder's table has its own size (ids the decoder's vocabulary lacks are encoded),
    the decoder and the logits keep vocab_size; one shared table for two sizes is refused, naming the fix."""
    model = build_model(ModelConfig(vocab_size=40, source_vocab_size=55, **TINY)).eval()
    assert model.src_embed.weight.shape == (55, 16) and model.tgt_embed.weight.shape == (40, 16)
    logits = model(torch.tensor([[50, 54, 7, 3]]), torch.tensor([[2, 11]]))
    assert logits.shape == (1, 2, 40)
    with pytest.raises(
        ValueError, match="source_vocab_size=55 differs from vocab_size=40; set share_all_embeddings=False"
    ):
        ModelConfig(vocab_size=40, source_vocab_size=55, share_all_embeddings=True)


def test_shared_vocab_tokenizer() -> None:
    """Source and target models sharing one vocabulary: pieces map through the vocabulary (unk where it lacks
    them), sources end with eos, a leading >>xx<< code is one piece, outputs decode by the target model, and the
    document round-trips through bytes (a checkpoint's and an export's tokenizer file)."""
    tok = marian_tokenizer()
    src, tgt = PAIRS[0]
    (ids,) = tok.encode_sources([src])
    assert ids[-1] == tok.eos_id == 0 and tok.pad_id == tok.bos_id == tok.vocab_size - 1 and tok.unk_id == 1
    assert [tok.vocab[i] for i in ids[:-1]] == tok.source.encode(src, out_type=str)
    (code,) = tok.encode_sources([">>en<< " + src])
    assert code[0] == tok.unk_id and code[1:] == tok.encode_sources([" " + src])[0]
    (out,) = tok.encode_targets([tgt])
    assert [tok.vocab[i] for i in out] == tok.target.encode(tgt, out_type=str) and tok.eos_id not in out
    assert tok.decode([tok.pad_id, *out, tok.eos_id]) == tgt
    assert tok.encode_targets(["§"]) == [[tok.ids["▁"], tok.unk_id]]  # a character no model knows

    again = load_tokenizer(tok.to_bytes())
    assert isinstance(again, SharedVocabTokenizer) and again.vocab == tok.vocab
    assert again.encode_sources([src]) == [ids] and zoo_load_tokenizer(tok.to_bytes()).encode_targets([tgt]) == [out]
    with pytest.raises(DataError, match="not a shared-vocab-sentencepiece tokenizer document"):
        zoo_load_tokenizer(b'{"kind": "other"}')
    with pytest.raises(ExportedModelError, match="no pad piece '<pad>'"):
        models = (tok.source.serialized_model_proto(), tok.target.serialized_model_proto())
        SharedVocabTokenizer(*models, ["</s>", "<unk>"])


def converted_checkpoint(path: Path, seed: int = 0) -> Path:
    """A random-init checkpoint with every conversion option on (swish, Marian positions, no embedding scale, a
    non-zero final logits bias, pad as decoder start) and the shared-vocabulary tokenizer, as zoo.convert writes."""
    tok = marian_tokenizer()
    cfg = ModelConfig(
        vocab_size=tok.vocab_size,
        **TINY,
        share_all_embeddings=True,
        pad_id=tok.pad_id,
        bos_id=tok.pad_id,
        eos_id=tok.eos_id,
        activation="swish",
        scale_embedding=False,
        positions="marian",
        final_logits_bias=True,
    )
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(cfg.vocab_size) * 0.5)
    save_checkpoint(
        path,
        {
            "model": model.state_dict(),
            "model_config": cfg.to_dict(),
            "entry": "options-test",
            "task": "translation",
            "tokenizer": tok.to_bytes(),
            "data_config": {"name": "pretrained", "task": "translation"},
            "heldout": {"src": [s for s, _ in PAIRS[:6]], "tgt": [t for _, t in PAIRS[:6]]},
        },
    )
    return path


def test_export_and_runtime_with_every_option(tmp_path: Path) -> None:
    """The options flow into the graphs and the runtime: the export verifies (ORT logits = torch's to 1e-4,
    identical greedy and beam hypotheses), writes the shared-vocabulary tokenizer (as tokenizer.model, the export
    format's one name for it), and the torch-free runtime
    translates and scores as the PyTorch API does."""
    checkpoint = converted_checkpoint(tmp_path / "model.pt")
    out = tmp_path / "export"
    manifest = export_checkpoint(export_config(checkpoint, out, "name=options-test", "verify.sentences=6"))
    assert isinstance(load_tokenizer((out / manifest["tokenizer"]).read_bytes()), SharedVocabTokenizer)
    assert manifest["verification"]["passed"], json.dumps(manifest["verification"])[:2000]
    assert manifest["model_config"]["positions"] == "marian"
    assert manifest["vocab"]["bos_id"] == manifest["vocab"]["pad_id"]  # pad as the decoder's start

    runtime = export.load(out, threads=1)
    torch_api = Translator.from_checkpoint(str(checkpoint))
    sources = [s for s, _ in PAIRS[6:]]
    for beam in (1, 3):
        assert runtime.translate(sources, beam_size=beam) == torch_api.translate(sources, beam_size=beam)
    targets = [t for _, t in PAIRS[6:]]
    ours, theirs = runtime.score(sources, targets), torch_api.score(sources, targets)
    assert [s.tokens for s in ours] == [s.tokens for s in theirs]
    np.testing.assert_allclose([s.score for s in ours], [s.score for s in theirs], atol=1e-4)
    model = model_from_checkpoint(load_checkpoint(checkpoint))
    assert model.final_logits_bias is not None and float(model.final_logits_bias.abs().sum()) > 0
