"""Marian (OPUS-MT) in transformers' form → the zoo's Transformer, exactly or not at all.

Marian in the zoo's terms: a post-norm encoder-decoder with biases everywhere and no embedding or final layer norm,
an FFN activation (swish in OPUS-MT), token embeddings × √d or not, Marian's sinusoidal position table, one
embedding shared by the encoder, the decoder and the output projection, a fixed final logits bias, decoding from
pad; text through source and target sentencepiece models sharing vocab.json. A config.json field or a weight that
would need anything else is refused with one line naming it, before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from torch import Tensor

from export.runtime.errors import ExportedModelError
from export.runtime.tokenizer import SharedVocabTokenizer
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
from zoo.model import ModelConfig, Transformer, build_model, marian_positions

# config.json fields the zoo represents in one value only: field → (that value, what another value would mean)
FIXED_FIELDS: dict[str, tuple[Any, str]] = {
    "normalize_before": (False, "pre-norm layers"),
    "normalize_embedding": (False, "a layer norm on the embeddings"),
    "layernorm_embedding": (False, "a layer norm on the embeddings"),
    "add_final_layer_norm": (False, "a final layer norm"),
    "add_bias_logits": (False, "a learned output bias"),
    "static_position_embeddings": (True, "learned positions"),
    "share_encoder_decoder_embeddings": (True, "separate source and target vocabularies"),
    "tie_word_embeddings": (True, "an output projection untied from the embedding"),
    "is_decoder": (False, "a decoder-only model"),
}
SPECIAL_PIECES = {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "</s>"}


def model_config(config: dict[str, Any], tokenizer: SharedVocabTokenizer) -> ModelConfig:
    """The ModelConfig of a Marian config.json, or ConvertError naming the first field the zoo cannot represent."""
    if config.get("model_type") != "marian":
        raise refuse("model_type", config.get("model_type"), "not a Marian model", "use --from fsmt for FSMT models")
    for field, (needed, meaning) in FIXED_FIELDS.items():
        if field in config and config[field] != needed:
            raise refuse(field, config[field], meaning, f"only {field}={needed!r} converts")
    same_in_both_stacks(
        config,
        (
            ("encoder_attention_heads", "decoder_attention_heads"),
            ("encoder_ffn_dim", "decoder_ffn_dim"),
            ("vocab_size", "decoder_vocab_size"),
        ),
    )
    special_ids(config, tokenizer.pad_id, tokenizer.eos_id, "pad", "vocab.json")
    if config.get("vocab_size") != tokenizer.vocab_size:
        raise refuse(
            "vocab_size", config.get("vocab_size"), f"vocab.json has {tokenizer.vocab_size} pieces", "re-save the model"
        )
    return ModelConfig(
        vocab_size=int(config["vocab_size"]),
        **shape_fields(config),
        share_decoder_embeddings=True,
        share_all_embeddings=True,
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.pad_id,  # pad as the decoder's start token
        eos_id=tokenizer.eos_id,
        activation=activation(config, "gelu"),
        scale_embedding=bool(config.get("scale_embedding", False)),
        positions="marian",
        final_logits_bias=True,
    )


def read_tokenizer(directory: Path) -> SharedVocabTokenizer:
    """source.spm, target.spm and vocab.json as the zoo's shared-vocabulary tokenizer (tokenizer_config.json's
    special pieces where it names them); separate source and target vocabularies are refused."""
    settings = read_json(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").is_file() else {}
    if settings.get("separate_vocabs") or (directory / "target_vocab.json").is_file():
        raise ConvertError(
            "tokenizer_config.json: separate_vocabs=True (separate source and target vocabularies) cannot be "
            "represented exactly; only models with one shared vocab.json convert"
        )
    pieces = read_vocabulary(directory / "vocab.json")
    models = []
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise ConvertError(f"{directory / name} is missing; a Marian model needs source.spm and target.spm")
        models.append((directory / name).read_bytes())
    special = {
        key.removesuffix("_token"): special_piece(settings.get(key), default) for key, default in SPECIAL_PIECES.items()
    }
    try:
        return SharedVocabTokenizer(*models, pieces, **special)
    except ExportedModelError as exc:
        raise ConvertError(f"{directory}: {exc}") from exc


def _names(cfg: ModelConfig) -> dict[str, str]:
    """transformers' weight name → the zoo's, for every weight the zoo loads."""
    return {"model.shared.weight": "src_embed.weight", "final_logits_bias": "final_logits_bias", **layer_names(cfg)}


# weights that must equal another one the zoo keeps (tied embeddings) or its own position table
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def build_converted(cfg: ModelConfig, weights: dict[str, Tensor]) -> Transformer:
    """The zoo model with Marian's weights, or ConvertError naming a weight that is missing, unknown, untied, or a
    position table other than Marian's sinusoidal one."""
    model = build_model(cfg).eval()
    state = model.state_dict()
    load_named(state, weights, _names(cfg), {*TIED, *POSITIONS}, "Marian")
    shared = weights["model.shared.weight"].float()
    for name in TIED:
        if name in weights and not torch.equal(weights[name].float(), shared):
            raise ConvertError(
                f"weight {name!r} differs from model.shared.weight (an untied embedding or output "
                "projection) and cannot be represented exactly"
            )
    table = marian_positions(cfg.max_positions, cfg.d_model)  # [P, D]
    for name in POSITIONS:
        if name in weights and not torch.allclose(weights[name].float(), table, rtol=0, atol=1e-5):
            raise ConvertError(
                f"weight {name!r} is not Marian's sinusoidal position table (learned positions?) "
                "and cannot be represented exactly"
            )
    state["tgt_embed.weight"] = state["src_embed.weight"]
    model.load_state_dict(state)
    return model


def marian_vocabulary(source: bytes, target: bytes) -> list[str]:
    """id → piece as OPUS-MT's vocab.json lays it out — eos, unk, the source model's pieces, the target's it lacks,
    pad last — for writing a Marian directory from two sentencepiece models (tests, benchmarks)."""
    pieces = list(dict.fromkeys([*_normal_pieces(source), *_normal_pieces(target)]))
    specials = ("</s>", "<unk>", "<pad>")
    return ["</s>", "<unk>", *(p for p in pieces if p not in specials), "<pad>"]


def _normal_pieces(model: bytes) -> list[str]:
    """The normal pieces of a sentencepiece model (no control, unknown or unused pieces), in id order."""
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(model)
    return [
        sp.id_to_piece(i)
        for i in range(sp.get_piece_size())
        if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i))
    ]
