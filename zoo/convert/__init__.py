"""Bring your own pretrained translator: `python -m zoo.convert --from marian|fsmt <dir> --out <file.pt>` turns a
transformers `save_pretrained` directory into a self-contained zoo checkpoint that every zoo command takes —
translate, evaluate, export with head pruning, serve.

    converter  `convert`: read, map, load, write — refusing, before anything is written, what the zoo's model
               cannot represent exactly
    marian     Marian (OPUS-MT): the config's fields, the weights' names, the shared-vocabulary tokenizer
    fsmt       FSMT (fairseq's WMT models): the config's fields, the weights' names, the Moses + BPE tokenizer
    common     what both share: layer weight names, search defaults, refusals, loading named weights
    hf_files   config.json and the weights (safetensors, or pytorch_model.bin with weights_only), offline
    __main__   the command (ordinary flags: its arguments are paths)
"""

from zoo.convert.converter import FORMATS, convert
from zoo.convert.hf_files import ConvertError

__all__ = ["FORMATS", "ConvertError", "convert"]
