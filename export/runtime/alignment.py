"""Word alignments from piece alignments: the models align each target *piece* to a source *piece* position (the
argmax of one decoder layer's cross-attention, zoo/decoding/alignment.py); markup transfer and terminology checks want
words.

The caveat: a "word" is what the tokenizer splits into pieces, not a span of the raw text —
* sentencepiece (zoo.train's joint model; Marian's source and target models): a piece beginning with ▁ starts a
  word, so words are the whitespace-separated tokens of the normalised text (punctuation stays attached: "Haus,"
  is one word). Text BPE-split before sentencepiece (fairseq-prepared data, `data.remove_bpe='@@ '`) keeps its
  `@@` marks as pieces: a piece after one that ends in `@@` continues the word.
* Moses + BPE (converted FSMT models, moses_bpe.py): words are Moses tokens — punctuation split off, apostrophes
  and `&` XML-escaped (`don't` → `don`, `&apos;t`) — so a word index may name part of a whitespace word. `</w>`
  ends a word's last piece; text BPE in the subword-nmt style marks the others with `@@` instead.
Special tokens (pad, bos, eos — Marian and FSMT append eos to every source — and a Marian `>>xx<<` language code)
belong to no word (-1), and a target piece aligned to one gives no pair. Attention-based alignments are soft and
one-to-one per target piece; the argmax may also point at a neighbour of the right word (Garg et al. 2019 report
alignment error rates of 30–40 % for averaged attention): good enough to carry tags or flag a missing term, not a
gold alignment.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .errors import ExportRuntimeError
from .moses_bpe import END, MosesBPETokenizer
from .tokenizer import SentencePieceTokenizer, SharedVocabTokenizer

SCHEMES = ("sentencepiece", "bpe")  # how pieces mark words: ▁ at a word's start; </w> at its end or @@ to continue
WORD_START = "\u2581"  # sentencepiece's ▁
CONTINUES = "@@"  # subword-nmt / fairseq BPE: the piece continues into the next one

Tokenizer = SentencePieceTokenizer | SharedVocabTokenizer | MosesBPETokenizer


def piece_words(
    pieces: Sequence[str], special: Sequence[bool] | None = None, scheme: str = "sentencepiece"
) -> np.ndarray:
    """The word index of every piece [P] int64 (0, 1, …; -1 for pieces `special` marks), by `scheme` (SCHEMES and
    the module docstring; "bpe" reads `</w>` ends where the pieces have any, else `@@` continuations)."""
    if scheme not in SCHEMES:
        raise ExportRuntimeError(f"scheme={scheme!r}: give one of {SCHEMES}")
    special = [False] * len(pieces) if special is None else list(special)
    if len(special) != len(pieces):
        raise ExportRuntimeError(f"got {len(special)} special flags for {len(pieces)} pieces")
    end_marked = scheme == "bpe" and any(p.endswith(END) for p in pieces)
    words = np.full(len(pieces), -1, dtype=np.int64)
    word, open_word = -1, False  # the current word; whether the next piece continues it
    for i, (piece, skip) in enumerate(zip(pieces, special, strict=True)):
        if skip:
            open_word = False
            continue
        if scheme == "sentencepiece":
            starts = not open_word or (piece.startswith(WORD_START) and not pieces[i - 1].endswith(CONTINUES))
            open_word = True
        else:
            starts = not open_word
            open_word = not piece.endswith(END) if end_marked else piece.endswith(CONTINUES)
        word += starts
        words[i] = word
    return words


def word_texts(pieces: Sequence[str], words: np.ndarray) -> list[str]:
    """Each word's text (its pieces joined, the markers removed), in word order: what a word index names."""
    out = [""] * (int(words.max()) + 1 if len(words) else 0)
    for piece, w in zip(pieces, words.tolist(), strict=True):
        if w >= 0:
            out[w] += piece.replace(WORD_START, "").removesuffix(END).removesuffix(CONTINUES)
    return out


def token_pieces(tokenizer: Tokenizer, ids: Sequence[int], side: str) -> tuple[list[str], list[bool]]:
    """The pieces of `ids` on the `side` ("source" or "target") of a model's tokenizer, and which are special
    (pad, bos, eos, a language code)."""
    if side not in ("source", "target"):
        raise ExportRuntimeError(f"side={side!r}: give 'source' or 'target'")
    if isinstance(tokenizer, SentencePieceTokenizer):
        pieces = [tokenizer.sp.id_to_piece(int(i)) for i in ids]
    elif isinstance(tokenizer, MosesBPETokenizer) and side == "source":
        pieces = [tokenizer.source_piece(int(i)) for i in ids]
    else:
        pieces = [tokenizer.id_to_piece(int(i)) for i in ids]
    specials = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id}
    special = [
        int(i) in specials or (p.startswith(">>") and p.endswith("<<")) for i, p in zip(ids, pieces, strict=True)
    ]
    return pieces, special


def scheme_of(tokenizer: Tokenizer) -> str:
    """How a tokenizer's pieces mark words (SCHEMES)."""
    return "bpe" if isinstance(tokenizer, MosesBPETokenizer) else "sentencepiece"


def word_alignment(positions: Sequence[int], src_words: np.ndarray, tgt_words: np.ndarray) -> list[tuple[int, int]]:
    """(source word, target word) pairs, sorted and each once, from each target piece j's aligned source piece
    `positions[j]` and the pieces' word indices (`piece_words`); pieces of no word give none. A position for the
    step after the last piece (eos) is ignored."""
    if len(positions) not in (len(tgt_words), len(tgt_words) + 1):
        raise ExportRuntimeError(f"got {len(positions)} aligned positions for {len(tgt_words)} target pieces")
    pairs = set()
    for j, s in enumerate(list(positions)[: len(tgt_words)]):
        if not 0 <= int(s) < len(src_words):
            raise ExportRuntimeError(
                f"target piece {j} is aligned to source piece {s}, outside 0 … {len(src_words) - 1}"
            )
        if src_words[s] >= 0 and tgt_words[j] >= 0:
            pairs.add((int(src_words[s]), int(tgt_words[j])))
    return sorted(pairs)


def align_words(
    tokenizer: Tokenizer, src_ids: Sequence[int], tgt_ids: Sequence[int], positions: Sequence[int]
) -> list[tuple[int, int]]:
    """(source word, target word) pairs of a hypothesis: its source ids as the model read them (`encode_texts`),
    its token ids and each one's aligned source position (`word_alignment`); `word_texts` of `token_pieces`
    names the words."""
    scheme = scheme_of(tokenizer)
    src_words = piece_words(*token_pieces(tokenizer, src_ids, "source"), scheme=scheme)
    tgt_words = piece_words(*token_pieces(tokenizer, tgt_ids, "target"), scheme=scheme)
    return word_alignment(positions, src_words, tgt_words)
