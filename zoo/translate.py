"""`python -m zoo.translate --checkpoint RUN_OR_PT "Guten Morgen." …` (or lines on stdin).

Ordinary flags, not Hydra: free text such as "Guten Morgen." is not a Hydra override."""

from __future__ import annotations

import argparse
import sys

from export.runtime.search import Search, SearchError
from zoo.api import Translator
from zoo.errors import one_line_errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.translate", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", "-c", required=True, help="run directory or .pt file")
    # an unset flag is the checkpoint's own setting (zoo.api.checkpoint_search), else Search's, the values' one home
    default = Search()
    own = "default: the checkpoint's, else"
    parser.add_argument("--beam", type=int, help=f"beam size, 1 = greedy ({own} {default.beam_size})")
    parser.add_argument("--len-penalty", type=float, help=f"{own} {default.len_penalty}")
    parser.add_argument("--max-len-a", type=float, help=f"output ≤ a · source + b tokens ({own} {default.max_len_a})")
    parser.add_argument("--max-len-b", type=int, help=f"{own} {default.max_len_b}")
    parser.add_argument("--no-repeat-ngram-size", type=int, help="ban repeating any n-gram of this size (0: off)")
    parser.add_argument("--repetition-penalty", type=float, help="lower tokens already output (1.0: off; e.g. 1.2)")
    parser.add_argument("--sampling", action="store_true", help="draw each token (needs --beam 1) instead of searching")
    parser.add_argument("--top-k", type=int, help="sampling: among the k most likely tokens (0: all)")
    parser.add_argument("--top-p", type=float, help="sampling: among the nucleus of this probability mass, (0, 1]")
    parser.add_argument("--temperature", type=float, help="sampling: logits / temperature (default 1.0)")
    parser.add_argument("--seed", type=int, help="sampling: the same seed and input give the same output")
    parser.add_argument(
        "--prefix", action="append", help="a target text the output starts with; once per sentence, in order"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("text", nargs="*", help="sentences to translate; read stdin lines when none are given")
    args = parser.parse_args(argv)
    with one_line_errors():
        translator = Translator.from_checkpoint(args.checkpoint, device=args.device)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin]
    with one_line_errors(SearchError):
        outputs = translator.translate(
            texts,
            beam_size=args.beam,
            len_penalty=args.len_penalty,
            max_len_a=args.max_len_a,
            max_len_b=args.max_len_b,
            target_prefix=args.prefix,
            no_repeat_ngram_size=args.no_repeat_ngram_size,
            repetition_penalty=args.repetition_penalty,
            sampling=1 if args.sampling else None,
            top_k=args.top_k,
            top_p=args.top_p,
            temperature=args.temperature,
            seed=args.seed,
        )
    for out in outputs:
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
