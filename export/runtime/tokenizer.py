"""Text to token ids and back, for the two kinds of tokenizer a checkpoint and an export carry.

* **Joint sentencepiece** (what zoo.train trains): one model, its piece ids are the model's vocabulary, sources
  and targets encoded alike, no eos on the source.
* **Shared vocabulary** (Marian / OPUS-MT: source.spm, target.spm, vocab.json): separate source and target
  sentencepiece models whose pieces map through one vocabulary list to the model's ids (pieces it lacks: unk),
  eos appended to every source, a leading `>>xx<<` language code kept as one piece, and no bos: the decoder starts
  from pad. Outputs are decoded by the target model, as Marian does.
* **Moses + BPE** (FSMT, fairseq's WMT models: separate source and target vocabularies): moses_bpe.py.

All travel as bytes (a checkpoint's "tokenizer"; an export's tokenizer.model, the one name the export format
gives its tokenizer file): sentencepiece's own model proto, or for the others one JSON document naming its kind;
`load_tokenizer` tells them apart by content. One implementation for both engines: zoo imports the converted
models' tokenizers from here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import sentencepiece as spm

from .errors import ExportedModelError
from .moses_bpe import MOSES_BPE_KIND, MosesBPETokenizer

SHARED_VOCAB_KIND = "shared-vocab-sentencepiece"


class TextTokenizer(Protocol):
    """What both engines ask of a tokenizer."""

    pad_id: int
    unk_id: int
    bos_id: int  # the decoder's start token
    eos_id: int

    @property
    def vocab_size(self) -> int: ...

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]: ...

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def to_bytes(self) -> bytes: ...


def _processor(model: bytes, what: str) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model)
    except (RuntimeError, TypeError) as exc:
        raise ExportedModelError(f"{what} is not a valid sentencepiece model ({exc})") from exc
    return sp


class SentencePieceTokenizer:
    """A joint sentencepiece model: its ids are the model's (zoo.train's tokenizer, fixed special ids)."""

    def __init__(self, model: bytes) -> None:
        self._bytes = bytes(model)
        self.sp = _processor(self._bytes, "the tokenizer")
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            self.sp.pad_id(),
            self.sp.unk_id(),
            self.sp.bos_id(),
            self.sp.eos_id(),
        )
        self._special = frozenset((self.pad_id, self.bos_id, self.eos_id))

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts), out_type=int)

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts), out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        """Raw text; pad/bos/eos are ignored, unk renders as ``⁇``."""
        return self.sp.decode([int(i) for i in ids if int(i) not in self._special])

    def to_bytes(self) -> bytes:
        return self._bytes


class SharedVocabTokenizer:
    """Source and target sentencepiece models sharing one vocabulary (the module docstring)."""

    def __init__(
        self,
        source_model: bytes,
        target_model: bytes,
        vocab: Sequence[str],
        pad: str = "<pad>",
        unk: str = "<unk>",
        eos: str = "</s>",
    ) -> None:
        self._source_bytes, self._target_bytes = bytes(source_model), bytes(target_model)
        self.source = _processor(self._source_bytes, "the source sentencepiece model")
        self.target = _processor(self._target_bytes, "the target sentencepiece model")
        self.vocab = list(vocab)  # id → piece
        self.ids = {piece: i for i, piece in enumerate(self.vocab)}  # piece → id
        if len(self.ids) != len(self.vocab):
            raise ExportedModelError("the shared vocabulary lists a piece twice; every piece needs one id")
        for role, piece in (("pad", pad), ("unk", unk), ("eos", eos)):
            if piece not in self.ids:
                raise ExportedModelError(f"the shared vocabulary has no {role} piece {piece!r}")
        self.specials = {"pad": pad, "unk": unk, "eos": eos}
        self.pad_id, self.unk_id, self.eos_id = self.ids[pad], self.ids[unk], self.ids[eos]
        self.bos_id = self.pad_id  # no bos: the decoder starts from pad
        self._special = frozenset((self.pad_id, self.eos_id))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _ids(self, pieces: Iterable[str]) -> list[int]:
        return [self.ids.get(p, self.unk_id) for p in pieces]

    def encode_sources(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of source texts: a leading `>>xx<<` language code as one piece, the rest by the source model, then
        eos (Marian's encoder input)."""
        out = []
        for text in texts:
            code: list[str] = []
            if text.startswith(">>") and (end := text.find("<<")) != -1:
                code, text = [text[: end + 2]], text[end + 2 :]
            out.append([*self._ids(code + self.source.encode(text, out_type=str)), self.eos_id])
        return out

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of target texts by the target model, without eos (the search and scoring add it)."""
        return [self._ids(pieces) for pieces in self.target.encode(list(texts), out_type=str)]

    def id_to_piece(self, token: int) -> str:
        """The vocabulary's piece of one id (zoo.analyze's axis labels), as the joint tokenizer's id_to_piece."""
        return self.vocab[token]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of output ids by the target model, as transformers' MarianTokenizer joins them: pieces the target
        model lacks kept as they are, then every ▁ a space, outer spaces stripped. Pad and eos are ignored; unk
        (and an id outside the vocabulary) renders as ``⁇``, as the joint tokenizer renders it."""
        unk = self.specials["unk"]
        pieces = [self.vocab[i] if 0 <= i < len(self.vocab) else unk for i in map(int, ids) if i not in self._special]
        return self.target.decode_pieces(pieces).replace("\u2581", " ").strip()

    def to_bytes(self) -> bytes:
        document = {
            "kind": SHARED_VOCAB_KIND,
            "version": 1,
            "source_model": base64.b64encode(self._source_bytes).decode("ascii"),
            "target_model": base64.b64encode(self._target_bytes).decode("ascii"),
            "vocab": self.vocab,
            "specials": self.specials,
        }
        return json.dumps(document, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> SharedVocabTokenizer:
        try:
            doc: Any = json.loads(data.decode("utf-8"))
        except ValueError as exc:
            raise ExportedModelError(
                f"not a {SHARED_VOCAB_KIND} tokenizer document ({exc}); re-create it with zoo.convert"
            ) from exc
        return cls.from_document(doc)

    @classmethod
    def from_document(cls, doc: Any) -> SharedVocabTokenizer:
        try:
            if doc.get("kind") != SHARED_VOCAB_KIND or doc.get("version") != 1:
                raise ValueError(f"kind {doc.get('kind')!r} version {doc.get('version')!r}")
            source, target = (base64.b64decode(doc[k], validate=True) for k in ("source_model", "target_model"))
            vocab, specials = doc["vocab"], doc["specials"]
            if not isinstance(vocab, list) or not all(isinstance(p, str) for p in vocab):
                raise ValueError("vocab is not a list of pieces")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ExportedModelError(
                f"not a {SHARED_VOCAB_KIND} tokenizer document ({exc}); re-create it with zoo.convert"
            ) from exc
        return cls(source, target, vocab, **{k: str(specials[k]) for k in ("pad", "unk", "eos")})


def load_tokenizer(data: bytes) -> SentencePieceTokenizer | SharedVocabTokenizer | MosesBPETokenizer:
    """The tokenizer serialised in `data`: a JSON document of its kind (parsed once), else a sentencepiece model
    proto."""
    if data[:1] != b"{":
        return SentencePieceTokenizer(data)
    try:
        doc = json.loads(data.decode("utf-8"))
    except ValueError:
        return SharedVocabTokenizer.from_bytes(data)  # names the problem
    if isinstance(doc, dict) and doc.get("kind") == MOSES_BPE_KIND:
        return MosesBPETokenizer.from_document(doc)
    return SharedVocabTokenizer.from_document(doc)
