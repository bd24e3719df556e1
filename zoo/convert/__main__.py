"""`python -m zoo.convert --from marian|fsmt <dir> --out <file.pt>`: a pretrained translator as a zoo checkpoint.

Ordinary flags, not Hydra: the arguments are paths. The checkpoint then works with every zoo command, e.g.
`python -m zoo.translate --checkpoint <file.pt> "Guten Morgen."` or
`python -m export checkpoint=<file.pt> keep_heads=4 out=<dir>` (give --heldout pairs: the export verifies on them
and keep_heads= scores the heads with them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zoo.convert import FORMATS, convert
from zoo.errors import one_line_errors
from zoo.flops import format_size_summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m zoo.convert",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--from", dest="source_format", required=True, choices=FORMATS, help="the model's family")
    parser.add_argument("directory", type=Path, help="a transformers save_pretrained directory (read offline)")
    parser.add_argument("--out", required=True, type=Path, help="the checkpoint to write (.pt)")
    parser.add_argument("--name", help="entry name of the checkpoint (default: the directory's name)")
    parser.add_argument(
        "--heldout",
        nargs=2,
        type=Path,
        metavar=("SRC", "TGT"),
        help="parallel text files; their first 32 pairs are stored for export verification and keep_heads=",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    with one_line_errors():
        result = convert(
            args.source_format,
            args.directory,
            args.out,
            args.name,
            tuple(args.heldout) if args.heldout else None,
            args.overwrite,
        )
    cfg = result["model_config"]
    source_vocab = f" (source {cfg['source_vocab_size']})" if cfg.get("source_vocab_size") is not None else ""
    print(
        f"wrote {result['path']}: {result['entry']} ({args.source_format}), {cfg['encoder_layers']}+"
        f"{cfg['decoder_layers']} layers, d_model {cfg['d_model']}, {cfg['num_heads']} heads, vocab "
        f"{cfg['vocab_size']}{source_vocab}; {format_size_summary(result['size'])}"
    )
    if result["generation"]:
        carried = ", ".join(f"{k}={v}" for k, v in result["generation"].items())
        print(f"search defaults carried into the checkpoint (python -m export starts from them): {carried}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
