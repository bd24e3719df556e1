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

from export.runtime.errors import ExportedModelError, ExportRuntimeError
from export.runtime.search import Search
from export.runtime.tokenizer import SharedVocabTokenizer
from zoo.convert.hf_files import ConvertError, read_json
from zoo.model import ModelConfig, Transformer, build_model, marian_positions

# transformers' activation names → the zoo's (ACT2FN: "swish" and "silu" are x·sigmoid(x), "gelu" the erf form)
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}

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
# the search defaults a model's author saved that the zoo's search has (generation_config.json, else config.json):
# transformers' name → Search's. `max_length` is not among them: transformers caps the output at an absolute length
# (OPUS-MT: 512 tokens), the zoo at one relative to the source (generation.max_len_a/b), which bounds a request's work
GENERATION_FIELDS = {"num_beams": "beam_size", "length_penalty": "len_penalty"}
SPECIAL_PIECES = {"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "</s>"}


def _refuse(field: str, value: Any, meaning: str, fix: str) -> ConvertError:
    return ConvertError(f"config.json: {field}={value!r} ({meaning}) cannot be represented exactly; {fix}")


def model_config(config: dict[str, Any], tokenizer: SharedVocabTokenizer) -> ModelConfig:
    """The ModelConfig of a Marian config.json, or ConvertError naming the first field the zoo cannot represent."""
    if config.get("model_type") != "marian":
        raise _refuse("model_type", config.get("model_type"), "not a Marian model", "use --from fsmt for FSMT models")
    for field, (needed, meaning) in FIXED_FIELDS.items():
        if field in config and config[field] != needed:
            raise _refuse(field, config[field], meaning, f"only {field}={needed!r} converts")
    for a, b in (
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
        ("vocab_size", "decoder_vocab_size"),
    ):
        if config.get(b) is not None and config.get(b) != config.get(a):
            raise _refuse(b, config[b], f"differs from {a}={config.get(a)!r}", f"only {b} equal to {a} converts")
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise _refuse(
            "activation_function", activation, "an FFN activation the zoo lacks", f"use {sorted(ACTIVATIONS)}"
        )
    ids = {"pad": tokenizer.pad_id, "eos": tokenizer.eos_id}
    for field, want, role in (
        ("pad_token_id", ids["pad"], "pad"),
        ("eos_token_id", ids["eos"], "eos"),
        ("decoder_start_token_id", ids["pad"], "pad (Marian decodes from pad)"),
    ):
        if config.get(field) != want:
            raise _refuse(field, config.get(field), f"vocab.json's {role} id is {want}", f"set {field}={want}")
    if config.get("forced_eos_token_id") not in (None, ids["eos"]):
        raise _refuse("forced_eos_token_id", config["forced_eos_token_id"], "not eos", f"set it to {ids['eos']}")
    if config.get("vocab_size") != tokenizer.vocab_size:
        raise _refuse(
            "vocab_size", config.get("vocab_size"), f"vocab.json has {tokenizer.vocab_size} pieces", "re-save the model"
        )
    return ModelConfig(
        vocab_size=int(config["vocab_size"]),
        d_model=int(config["d_model"]),
        encoder_layers=int(config["encoder_layers"]),
        decoder_layers=int(config["decoder_layers"]),
        num_heads=int(config["encoder_attention_heads"]),
        ffn_dim=int(config["encoder_ffn_dim"]),
        dropout=float(config.get("dropout", 0.1)),
        attention_dropout=float(config.get("attention_dropout", 0.0)),
        activation_dropout=float(config.get("activation_dropout", 0.0)),
        share_decoder_embeddings=True,
        share_all_embeddings=True,
        max_positions=int(config.get("max_position_embeddings", 1024)),
        pad_id=tokenizer.pad_id,
        bos_id=tokenizer.pad_id,  # pad as the decoder's start token
        eos_id=tokenizer.eos_id,
        activation=ACTIVATIONS[activation],
        scale_embedding=bool(config.get("scale_embedding", False)),
        positions="marian",
        final_logits_bias=True,
    )


def generation_defaults(directory: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The model's own search defaults as Search settings (GENERATION_FIELDS), from generation_config.json where the
    directory has one, else from the older config.json fields; ConvertError naming the field if the zoo's search
    cannot take a value."""
    file = directory / "generation_config.json"
    saved = read_json(file) if file.is_file() else config
    where = file.name if file.is_file() else "config.json"
    defaults = {}
    for theirs, ours in GENERATION_FIELDS.items():
        value = saved.get(theirs)
        if value is None:
            continue
        try:
            Search(**{ours: value})
        except (ExportRuntimeError, TypeError, ValueError) as exc:
            message = f"{where}: {theirs}={value!r} cannot be the zoo's {ours} ({exc}); fix the field"
            raise ConvertError(message) from exc
        defaults[ours] = value
    return defaults


def read_tokenizer(directory: Path) -> SharedVocabTokenizer:
    """source.spm, target.spm and vocab.json as the zoo's shared-vocabulary tokenizer (tokenizer_config.json's
    special pieces where it names them); separate source and target vocabularies are refused."""
    settings = read_json(directory / "tokenizer_config.json") if (directory / "tokenizer_config.json").is_file() else {}
    if settings.get("separate_vocabs") or (directory / "target_vocab.json").is_file():
        raise ConvertError(
            "tokenizer_config.json: separate_vocabs=True (separate source and target vocabularies) cannot be "
            "represented exactly; only models with one shared vocab.json convert"
        )
    vocab = read_json(directory / "vocab.json")
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise ConvertError(f"{directory / 'vocab.json'} must map every piece to one id 0 … n-1; re-save the tokenizer")
    pieces = [""] * len(vocab)
    for piece, i in vocab.items():
        pieces[i] = piece
    models = []
    for name in ("source.spm", "target.spm"):
        if not (directory / name).is_file():
            raise ConvertError(f"{directory / name} is missing; a Marian model needs source.spm and target.spm")
        models.append((directory / name).read_bytes())
    special = {key.removesuffix("_token"): _piece(settings.get(key), piece) for key, piece in SPECIAL_PIECES.items()}
    try:
        return SharedVocabTokenizer(*models, pieces, **special)
    except ExportedModelError as exc:
        raise ConvertError(f"{directory}: {exc}") from exc


def _piece(value: Any, default: str) -> str:
    """A special piece as tokenizer_config.json gives it: a string, or an added token's {"content": …}."""
    if isinstance(value, dict):
        value = value.get("content")
    return str(value) if value else default


def _names(cfg: ModelConfig) -> dict[str, str]:
    """transformers' weight name → the zoo's, for every weight the zoo loads."""
    names = {"model.shared.weight": "src_embed.weight", "final_logits_bias": "final_logits_bias"}
    projections = [f"{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")]
    projections += ["out_proj.weight", "out_proj.bias"]
    for stack, count, blocks in (
        ("encoder", cfg.encoder_layers, {"self_attn": "self_attn"}),
        ("decoder", cfg.decoder_layers, {"self_attn": "self_attn", "encoder_attn": "cross_attn"}),
    ):
        norms = {"self_attn_layer_norm": "attn_block.norm", "final_layer_norm": "ffn_block.norm"}
        if stack == "decoder":
            norms = {
                "self_attn_layer_norm": "self_block.norm",
                "encoder_attn_layer_norm": "cross_block.norm",
                "final_layer_norm": "ffn_block.norm",
            }
        for i in range(count):
            hf, zoo = f"model.{stack}.layers.{i}.", f"{stack}.layers.{i}."
            for theirs, ours in blocks.items():
                names.update({f"{hf}{theirs}.{p}": f"{zoo}{ours}.{p}" for p in projections})
            for theirs, ours in norms.items():
                names.update({f"{hf}{theirs}.{w}": f"{zoo}{ours}.{w}" for w in ("weight", "bias")})
            names.update({f"{hf}fc{k}.{w}": f"{zoo}ffn.fc{k}.{w}" for k in (1, 2) for w in ("weight", "bias")})
    return names


# weights that must equal another one the zoo keeps (tied embeddings) or its own position table
TIED = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def build_converted(cfg: ModelConfig, weights: dict[str, Tensor]) -> Transformer:
    """The zoo model with Marian's weights, or ConvertError naming a weight that is missing, unknown, untied, or a
    position table other than Marian's sinusoidal one."""
    model = build_model(cfg).eval()
    state = model.state_dict()
    names = _names(cfg)
    for name in weights:
        if name not in names and name not in TIED and name not in POSITIONS:
            raise ConvertError(
                f"weight {name!r} has no counterpart in the zoo's model; this Marian variant cannot "
                "be converted exactly"
            )
    for theirs, ours in names.items():
        if theirs not in weights:
            raise ConvertError(
                f"weight {theirs!r} is missing from the model's weights; re-save it with save_pretrained"
            )
        value = weights[theirs].float()
        if theirs == "final_logits_bias":
            value = value.reshape(-1)  # [1, V] -> [V]
        if value.shape != state[ours].shape:
            raise ConvertError(
                f"weight {theirs!r} has shape {tuple(value.shape)}, config.json implies {tuple(state[ours].shape)}"
            )
        state[ours] = value
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
