"""What the converters of transformers' encoder-decoder translators share: Marian and FSMT lay their layers out as
BART does (post-norm, biases everywhere), name their search defaults alike, and are refused the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from export.runtime.errors import ExportRuntimeError
from export.runtime.search import Search
from zoo.convert.hf_files import ConvertError, read_json
from zoo.model import ModelConfig

# transformers' activation names → the zoo's (ACT2FN: "swish" and "silu" are x·sigmoid(x), "gelu" the erf form)
ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}
# the search defaults a model's author saved that the zoo's search has (generation_config.json, else config.json):
# transformers' name → Search's. `max_length` is not among them: transformers caps the output at an absolute length
# (OPUS-MT: 512 tokens), the zoo at one relative to the source (generation.max_len_a/b), which bounds a request's work
GENERATION_FIELDS = {"num_beams": "beam_size", "length_penalty": "len_penalty"}


def refuse(field: str, value: Any, meaning: str, fix: str) -> ConvertError:
    """The one-line refusal of a config.json field the zoo cannot represent exactly."""
    return ConvertError(f"config.json: {field}={value!r} ({meaning}) cannot be represented exactly; {fix}")


def read_vocabulary(path: Path) -> list[str]:
    """id → piece of a vocabulary JSON file (piece → id), or ConvertError unless its ids are 0 … n-1, once each."""
    vocab = read_json(path)
    if not isinstance(vocab, dict) or sorted(vocab.values()) != list(range(len(vocab))):
        raise ConvertError(f"{path} must map every piece to one id 0 … n-1; re-save the tokenizer")
    pieces = [""] * len(vocab)
    for piece, i in vocab.items():
        pieces[i] = piece
    return pieces


def special_piece(value: Any, default: str) -> str:
    """A special piece as tokenizer_config.json gives it: a string, or an added token's {"content": …}."""
    if isinstance(value, dict):
        value = value.get("content")
    return str(value) if value else default


def activation(config: dict[str, Any], default: str) -> str:
    """The zoo's name of config.json's FFN activation, or the refusal naming the field."""
    name = config.get("activation_function", default)
    if name not in ACTIVATIONS:
        raise refuse("activation_function", name, "an FFN activation the zoo lacks", f"use {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def same_in_both_stacks(config: dict[str, Any], pairs: tuple[tuple[str, str], ...]) -> None:
    """Refuse an encoder and a decoder that differ in a value the zoo's config holds once (heads, FFN width)."""
    for a, b in pairs:
        if config.get(b) is not None and config.get(b) != config.get(a):
            raise refuse(b, config[b], f"differs from {a}={config.get(a)!r}", f"only {b} equal to {a} converts")


def special_ids(config: dict[str, Any], pad: int, eos: int, start: str, vocabulary: str) -> None:
    """Refuse a config.json whose pad, eos, decoder start (`start`: "pad" or "eos", the family's) or forced eos id
    is not the tokenizer's (`vocabulary` names where the ids come from, for the message)."""
    ids = {"pad": pad, "eos": eos}
    for field, want, role in (
        ("pad_token_id", pad, "pad"),
        ("eos_token_id", eos, "eos"),
        ("decoder_start_token_id", ids[start], f"{start} (the family decodes from {start})"),
    ):
        if config.get(field) != want:
            raise refuse(field, config.get(field), f"{vocabulary}'s {role} id is {want}", f"set {field}={want}")
    if config.get("forced_eos_token_id") not in (None, eos):
        raise refuse("forced_eos_token_id", config["forced_eos_token_id"], "not eos", f"set it to {eos}")


def shape_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The ModelConfig fields both families name alike in config.json: widths, depths, heads, dropouts, positions
    (the encoder's values: same_in_both_stacks checked the decoder's)."""
    return {
        "d_model": int(config["d_model"]),
        "encoder_layers": int(config["encoder_layers"]),
        "decoder_layers": int(config["decoder_layers"]),
        "num_heads": int(config["encoder_attention_heads"]),
        "ffn_dim": int(config["encoder_ffn_dim"]),
        "dropout": float(config.get("dropout", 0.1)),
        "attention_dropout": float(config.get("attention_dropout", 0.0)),
        "activation_dropout": float(config.get("activation_dropout", 0.0)),
        "max_positions": int(config.get("max_position_embeddings", 1024)),
    }


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


def layer_names(cfg: ModelConfig) -> dict[str, str]:
    """transformers' weight name → the zoo's, for every weight of the encoder and decoder layers (BART's layout)."""
    names = {}
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


def load_named(
    state: dict[str, Tensor], weights: dict[str, Tensor], names: dict[str, str], checked: set[str], family: str
) -> None:
    """Copy `weights` into the zoo's `state` under `names` (theirs → ours), or ConvertError naming a weight that is
    unknown (neither named nor among the `checked` ones the caller compares itself), missing or misshapen."""
    for name in weights:
        if name not in names and name not in checked:
            raise ConvertError(
                f"weight {name!r} has no counterpart in the zoo's model; this {family} variant cannot "
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
