"""`convert`: a transformers `save_pretrained` directory → a self-contained zoo checkpoint (zoo/DESIGN.md §3b).

`convert` reads as its steps, all before anything is written (a model the zoo cannot represent exactly is refused
with one line naming the field or weight, and no file appears):
  read      config.json, the weights (hf_files: safetensors, or pytorch_model.bin with weights_only) and the
            tokenizer files, offline — transformers is not needed
  map       the config to a ModelConfig, refusing what the zoo's model lacks (marian.py, fsmt.py: model_config)
  load      the weights into the zoo's Transformer under its names, checking tied embeddings and the position table
            (build_converted; FSMT's weights decide which of its embeddings are one table)
  write     the checkpoint, atomically: weights, ModelConfig, tokenizer, data config, held-out pairs, the model's own
            search defaults (num_beams, length_penalty: `python -m export` starts from them), provenance
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from export.runtime.manifest import sha256_file
from zoo.checkpoint import save_checkpoint
from zoo.convert import fsmt, marian
from zoo.convert.common import generation_defaults
from zoo.convert.hf_files import ConvertError, read_json, read_weights
from zoo.flops import size_summary

FAMILIES = {"marian": marian, "fsmt": fsmt}  # --from: the module that reads that family's files
FORMATS = tuple(FAMILIES)
HELDOUT_SENTENCES = 32  # as zoo.train stores: what export verifies on and keep_heads= scores heads with
DATA_NAME = "pretrained"  # the data part of the public name <entry>-<data>: no corpus trained it here


def read_heldout(src: Path, tgt: Path) -> dict[str, list[str]]:
    """The first HELDOUT_SENTENCES line pairs of two parallel text files."""
    sources, targets = (p.read_text(encoding="utf-8").splitlines() for p in (src, tgt))
    if len(sources) != len(targets) or not sources:
        raise ConvertError(f"--heldout: {src} has {len(sources)} lines, {tgt} {len(targets)}; give parallel lines")
    return {"src": sources[:HELDOUT_SENTENCES], "tgt": targets[:HELDOUT_SENTENCES]}


def convert(
    source_format: str,
    directory: str | Path,
    out: str | Path,
    name: str | None = None,
    heldout: tuple[Path, Path] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Convert the pretrained model in `directory` to the zoo checkpoint `out`; returns what was written (path,
    entry, ModelConfig, size). ConvertError, with nothing written, for anything that does not convert exactly."""
    directory, out = Path(directory), Path(out)
    if source_format not in FORMATS:
        raise ConvertError(f"--from {source_format!r} is not supported; use one of {', '.join(FORMATS)}")
    if not directory.is_dir():
        raise ConvertError(f"{directory} is not a directory; pass a directory written by save_pretrained")
    if out.exists() and not overwrite:
        raise ConvertError(f"{out} already exists; pass --overwrite to replace it")
    family = FAMILIES[source_format]
    config = read_json(directory / "config.json")
    tokenizer = family.read_tokenizer(directory)
    cfg = family.model_config(config, tokenizer)
    generation = generation_defaults(directory, config)
    model = family.build_converted(cfg, read_weights(directory))
    cfg = model.cfg  # the weights may have decided the embedding sharing (FSMT)
    pairs = read_heldout(*heldout) if heldout else {"src": [], "tgt": []}
    entry = name or directory.resolve().name
    files = sorted(p for p in directory.iterdir() if p.is_file())
    payload = {
        "model": model.state_dict(),
        "model_config": cfg.to_dict(),
        "entry": entry,
        "task": "translation",
        "tokenizer": tokenizer.to_bytes(),
        "data_config": {"name": DATA_NAME, "kind": DATA_NAME, "task": "translation", "max_len": cfg.max_positions},
        "heldout": pairs,
        "generation": generation,
        "size": size_summary(model),
        "converted_from": {
            "format": source_format,
            "directory": str(directory.resolve()),
            "files": {p.name: sha256_file(p) for p in files},
        },
    }
    save_checkpoint(out, payload)
    return {
        "path": str(out),
        "entry": entry,
        "model_config": cfg.to_dict(),
        "generation": generation,
        "size": payload["size"],
    }
