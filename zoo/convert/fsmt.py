"""FSMT (fairseq's WMT translators in transformers' form) → the zoo's Transformer, exactly or not at all.

FSMT in the zoo's terms: Marian's post-norm layers (common.py), an FFN activation (ReLU in the WMT19 models),
token embeddings × √d or not, fairseq's sinusoidal table counted from pad + 1 (`position_offset`), separate source
and target vocabularies (`source_vocab_size`: the encoder's embedding its own unless the weights are equal), an output
projection tied to the decoder's embedding or its own, no logits bias, decoding from eos; text through Moses + BPE
(vocab-src.json, vocab-tgt.json, merges.txt: export.runtime.moses_bpe). A config.json field or a weight that would
need anything else is refused with one line naming it, before anything is written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from export.runtime.errors import ExportedModelError
from export.runtime.moses_bpe import MosesBPETokenizer
from zoo.convert.common import (
    activation,
    layer_names,
    load_named,
    read_vocabulary,
    refuse,
    same_in_both_stacks,
    shape_fields,
    special_ids,
    special_piece,
)
from zoo.convert.hf_files import ConvertError, read_json
from zoo.model import ModelConfig, Transformer, build_model, sinusoidal_positions

TOKENIZER_FILES = ("vocab-src.json", "vocab-tgt.json", "merges.txt")
# tokenizer_config.json's special pieces: role → (its key, the default); FSMTTokenizer appends sep_token as eos
SPECIAL_PIECES = {"pad": ("pad_token", "<pad>"), "unk": ("unk_token", "<unk>"), "eos": ("sep_token", "</s>")}
EMBEDDINGS = {
    "model.encoder.embed_tokens.weight": "src_embed.weight",
    "model.decoder.embed_tokens.weight": "tgt_embed.weight",
}
OUTPUT = "model.decoder.output_projection.weight"
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def _merges(path: Path) -> list[tuple[str, str]]:
    """merges.txt's pairs in rank order (a line's third column, a count, is ignored, as transformers does)."""
    if not path.is_file():
        raise ConvertError(f"{path} is missing; an FSMT model needs {', '.join(TOKENIZER_FILES)}")
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]  # the file ends with a newline
    pairs = [tuple(line.split()[:2]) for line in lines]
    for number, pair in enumerate(pairs, 1):
        if len(pair) != 2:
            raise ConvertError(f"{path}: line {number} is not a pair of symbols; re-save the tokenizer")
    return pairs  # type: ignore[return-value]


def read_tokenizer(directory: Path) -> MosesBPETokenizer:
    """vocab-src.json, vocab-tgt.json and merges.txt, with tokenizer_config.json's languages and special pieces."""
    settings = read_json(directory / "tokenizer_config.json")
    langs = settings.get("langs")
    if not (isinstance(langs, list) and len(langs) == 2 and all(isinstance(lang, str) for lang in langs)):
        raise ConvertError(
            f"{directory / 'tokenizer_config.json'}: langs={langs!r} must name the source and target languages, "
            'e.g. ["de", "en"]; re-save the tokenizer'
        )
    for name in TOKENIZER_FILES:
        if not (directory / name).is_file():
            raise ConvertError(f"{directory / name} is missing; an FSMT model needs {', '.join(TOKENIZER_FILES)}")
    special = {role: special_piece(settings.get(key), piece) for role, (key, piece) in SPECIAL_PIECES.items()}
    try:
        return MosesBPETokenizer(
            read_vocabulary(directory / "vocab-src.json"),
            read_vocabulary(directory / "vocab-tgt.json"),
            _merges(directory / "merges.txt"),
            *langs,
            lower_case=bool(settings.get("do_lower_case", False)),
            **special,
        )
    except ExportedModelError as exc:
        raise ConvertError(f"{directory}: {exc}") from exc


def model_config(config: dict[str, Any], tokenizer: MosesBPETokenizer) -> ModelConfig:
    """The ModelConfig of an FSMT config.json, or ConvertError naming the first field the zoo cannot represent. The
    embedding sharing is the weights' to say (build_converted); this starts from separate tables and a tied output."""
    if config.get("model_type") != "fsmt":
        raise refuse("model_type", config.get("model_type"), "not an FSMT model", "use --from marian for Marian models")
    same_in_both_stacks(
        config, (("encoder_attention_heads", "decoder_attention_heads"), ("encoder_ffn_dim", "decoder_ffn_dim"))
    )
    if list(config.get("langs") or []) != list(tokenizer.langs):
        raise refuse("langs", config.get("langs"), f"the tokenizer's are {list(tokenizer.langs)}", "re-save the model")
    for field, size, which in (
        ("src_vocab_size", tokenizer.source_vocab_size, "vocab-src.json"),
        ("tgt_vocab_size", tokenizer.vocab_size, "vocab-tgt.json"),
    ):
        if config.get(field) != size:
            raise refuse(field, config.get(field), f"{which} has {size} pieces", "re-save the model")
    special_ids(config, tokenizer.pad_id, tokenizer.eos_id, "eos", "the vocabularies")
    return ModelConfig(
        vocab_size=int(config["tgt_vocab_size"]),
        source_vocab_size=int(config["src_vocab_size"]),
        **shape_fields(config),
        share_decoder_embeddings=True,
        share_all_embeddings=False,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.eos_id,  # eos as the decoder's start token
        eos_id=tokenizer.eos_id,
        activation=activation(config, "relu"),
        scale_embedding=bool(config.get("scale_embedding", True)),
        positions="fairseq",
        position_offset=tokenizer.pad_id + 1,
        final_logits_bias=False,
    )


def _fairseq_table(rows: int, dim: int, pad: int) -> torch.Tensor:
    """[rows, dim] fairseq's sinusoidal table with the pad row zeroed, as FSMT stores it."""
    table = sinusoidal_positions(rows, dim)
    table[pad] = 0
    return table


def build_converted(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> Transformer:
    """The zoo model with FSMT's weights — one embedding table where the encoder's and decoder's are equal, an own
    output projection where it differs from the decoder's embedding — or ConvertError naming a weight that is
    missing, unknown, or a position table other than fairseq's sinusoidal one."""
    encoder, decoder = EMBEDDINGS
    if encoder not in weights and decoder in weights:  # tie_word_embeddings=True saves the shared table once
        weights = {**weights, encoder: weights[decoder]}
    for name in EMBEDDINGS:
        if name not in weights:
            raise ConvertError(f"weight {name!r} is missing from the model's weights; re-save it with save_pretrained")
    source, target = (weights[name].float() for name in EMBEDDINGS)
    share_all = source.shape == target.shape and torch.equal(source, target)
    tied_output = OUTPUT not in weights or torch.equal(weights[OUTPUT].float(), target)
    cfg = dataclasses.replace(
        cfg,
        share_all_embeddings=share_all,
        source_vocab_size=None if share_all else cfg.source_vocab_size,
        share_decoder_embeddings=tied_output,
    )
    model = build_model(cfg).eval()
    state = model.state_dict()
    names = {**layer_names(cfg), **({} if share_all else EMBEDDINGS)}
    if share_all:
        names["model.encoder.embed_tokens.weight"] = "src_embed.weight"
    if not tied_output:
        names[OUTPUT] = "output_proj.weight"
    load_named(state, weights, names, {*EMBEDDINGS, OUTPUT, *POSITIONS}, "FSMT")
    for name in POSITIONS:
        if name not in weights:
            continue
        stored = weights[name].float()  # [max_positions + pad + 1, D]
        table = _fairseq_table(stored.shape[0], cfg.d_model, cfg.pad_id)
        if stored.shape[1] != cfg.d_model or not torch.allclose(stored, table, rtol=0, atol=1e-5):
            raise ConvertError(
                f"weight {name!r} is not fairseq's sinusoidal position table (learned positions?) "
                "and cannot be represented exactly"
            )
    if share_all:
        state["tgt_embed.weight"] = state["src_embed.weight"]
    model.load_state_dict(state)
    return model
