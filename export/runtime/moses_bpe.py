"""Moses tokenisation + BPE over separate source and target vocabularies: fairseq's WMT translators (FSMT), encoded
and decoded as transformers' FSMTTokenizer does.

A text: Moses' unicode-punctuation replacement and punctuation normalisation for its language, control characters
removed, Moses tokenisation (aggressive dash splits, XML-escaped), then each token split by the BPE merges (ranked
by their line in merges.txt, `</w>` closing a word) and looked up in the source or target vocabulary (pieces it
lacks: unk). Sources end with eos; the decoder starts from eos (fairseq). Output ids: the target pieces joined
(`</w>` a space), then Moses detokenisation. sacremoses does the Moses steps; it is imported when such a tokenizer
is built, so only FSMT models need it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

from .errors import ExportedModelError

MOSES_BPE_KIND = "moses-bpe"
END = "</w>"  # closes the last piece of a word
CACHE_WORDS = 100_000  # words whose BPE split is remembered: bounded, a server sees unbounded text


def _sacremoses() -> Any:
    try:
        import sacremoses  # only FSMT models need it (the module docstring)
    except ImportError as exc:
        raise ExportedModelError(
            "this model's tokenizer (Moses + BPE, a converted FSMT model) needs sacremoses; pip install "
            "sacremoses==0.1.1"
        ) from exc
    return sacremoses


def merge_pair(parts: Sequence[str], pair: tuple[str, str]) -> list[str]:
    """`parts` with every occurrence of the adjacent `pair` joined into one symbol, left to right."""
    merged, i = [], 0
    while i < len(parts):
        if i < len(parts) - 1 and (parts[i], parts[i + 1]) == pair:
            merged.append(parts[i] + parts[i + 1])
            i += 2
        else:
            merged.append(parts[i])
            i += 1
    return merged


def _index(vocab: Sequence[str], which: str) -> dict[str, int]:
    ids = {piece: i for i, piece in enumerate(vocab)}
    if len(ids) != len(vocab):
        raise ExportedModelError(f"the {which} vocabulary lists a piece twice; every piece needs one id")
    return ids


class MosesBPETokenizer:
    """Moses + BPE with a source and a target vocabulary (the module docstring)."""

    def __init__(
        self,
        source_vocab: Sequence[str],
        target_vocab: Sequence[str],
        merges: Sequence[Sequence[str]],
        source_lang: str,
        target_lang: str,
        pad: str = "<pad>",
        unk: str = "<unk>",
        eos: str = "</s>",
        lower_case: bool = False,
    ) -> None:
        self.source_vocab, self.target_vocab = list(source_vocab), list(target_vocab)  # id → piece
        self.source_ids, self.target_ids = _index(self.source_vocab, "source"), _index(self.target_vocab, "target")
        self.merges = [(str(a), str(b)) for a, b in merges]
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}  # a repeated pair: its last line, as HF
        self.langs = (source_lang, target_lang)
        self.lower_case = lower_case
        self.specials = {"pad": pad, "unk": unk, "eos": eos}
        for role, piece in self.specials.items():
            for which, ids in (("source", self.source_ids), ("target", self.target_ids)):
                if piece not in ids:
                    raise ExportedModelError(f"the {which} vocabulary has no {role} piece {piece!r}")
                if ids[piece] != self.target_ids[piece]:
                    raise ExportedModelError(f"the {role} piece {piece!r} has different ids in the two vocabularies")
        self.pad_id, self.unk_id, self.eos_id = (self.target_ids[p] for p in (pad, unk, eos))
        self.source_unk_id = self.source_ids[unk]
        self.bos_id = self.eos_id  # fairseq's decoder starts from eos
        self._special = frozenset((self.pad_id, self.eos_id))
        moses = _sacremoses()
        self._normalizers = {lang: moses.MosesPunctNormalizer(lang=lang) for lang in self.langs}
        self._tokenizers = {lang: moses.MosesTokenizer(lang=lang) for lang in self.langs}
        self._detokenizer = moses.MosesDetokenizer(lang=target_lang)
        self._splits: dict[str, list[str]] = {}

    @property
    def vocab_size(self) -> int:
        """The target (decoder) vocabulary's size, as the model's vocab_size."""
        return len(self.target_vocab)

    @property
    def source_vocab_size(self) -> int:
        return len(self.source_vocab)

    def _words(self, text: str, lang: str) -> list[str]:
        """Moses' steps as FSMTTokenizer takes them: punctuation, normalisation, control characters, tokens."""
        if self.lower_case:
            text = text.lower()
        normalizer = self._normalizers[lang]
        text = normalizer.remove_control_chars(normalizer.normalize(normalizer.replace_unicode_punct(text)))
        return self._tokenizers[lang].tokenize(text, aggressive_dash_splits=True, return_str=False, escape=True)

    def bpe(self, word: str) -> list[str]:
        """`word`'s pieces: its characters, the last closed by `</w>`, merged lowest rank first until none applies."""
        if word in self._splits:
            return self._splits[word]
        parts = [*word[:-1], word[-1] + END]
        while len(parts) > 1:
            pairs = set(itertools.pairwise(parts))
            best = min(pairs, key=lambda pair: self.ranks.get(pair, len(self.ranks)))
            if best not in self.ranks:
                break
            parts = merge_pair(parts, best)
        if len(self._splits) >= CACHE_WORDS:
            self._splits.clear()
        self._splits[word] = parts
        return parts

    def _pieces(self, text: str, lang: str) -> list[str]:
        return [piece for word in self._words(text, lang) if word for piece in self.bpe(word)]

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of source texts in the source vocabulary, eos appended (the encoder's input)."""
        lang, ids = self.langs[0], self.source_ids
        return [[*(ids.get(p, self.source_unk_id) for p in self._pieces(t, lang)), self.eos_id] for t in texts]

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of target texts in the target vocabulary, without eos (the search and scoring add it)."""
        lang, ids = self.langs[1], self.target_ids
        return [[ids.get(p, self.unk_id) for p in self._pieces(t, lang)] for t in texts]

    def id_to_piece(self, token: int) -> str:
        """The target vocabulary's piece of one id (zoo.analyze's axis labels)."""
        return self.target_vocab[token]

    def source_piece(self, token: int) -> str:
        """The source vocabulary's piece of one id."""
        return self.source_vocab[token]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of output ids: target pieces joined, `</w>` a space, Moses-detokenised (FSMTTokenizer's decode).
        Pad and eos are ignored; unk (and an id outside the vocabulary) renders as the unk piece."""
        unk = self.specials["unk"]
        pieces = [
            self.target_vocab[i] if 0 <= i < len(self.target_vocab) else unk
            for i in map(int, ids)
            if i not in self._special
        ]
        words = "".join(p.replace(END, " ") for p in pieces).split()
        return self._detokenizer.detokenize(words)

    def to_bytes(self) -> bytes:
        document = {
            "kind": MOSES_BPE_KIND,
            "version": 1,
            "source_vocab": self.source_vocab,
            "target_vocab": self.target_vocab,
            "merges": [list(m) for m in self.merges],
            "langs": list(self.langs),
            "specials": self.specials,
            "lower_case": self.lower_case,
        }
        return json.dumps(document, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_document(cls, doc: dict[str, Any]) -> MosesBPETokenizer:
        try:
            if doc.get("kind") != MOSES_BPE_KIND or doc.get("version") != 1:
                raise ValueError(f"kind {doc.get('kind')!r} version {doc.get('version')!r}")
            vocabs = doc["source_vocab"], doc["target_vocab"]
            if not all(isinstance(v, list) and all(isinstance(p, str) for p in v) for v in vocabs):
                raise ValueError("a vocabulary is not a list of pieces")
            merges = doc["merges"]
            if not all(isinstance(m, list) and len(m) == 2 for m in merges):
                raise ValueError("merges are not pairs")
            source_lang, target_lang = (str(lang) for lang in doc["langs"])
            specials = {k: str(doc["specials"][k]) for k in ("pad", "unk", "eos")}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExportedModelError(
                f"not a {MOSES_BPE_KIND} tokenizer document ({exc}); re-create it with zoo.convert"
            ) from exc
        return cls(*vocabs, merges, source_lang, target_lang, lower_case=bool(doc.get("lower_case")), **specials)
