"""A lexical vocabulary shortlist: which target tokens a batch's decoder steps compute logits for.

Why: the output projection and softmax over the whole vocabulary are a quarter of a decoder step's FLOPs at a 10k
vocabulary and about two thirds at OPUS-MT's 58k; the tokens a source can plausibly produce are a few hundred
(Marian's lexical shortlists, CTranslate2's vocabulary map). A shortlist lists, for each source token, the target
tokens most likely in the translation of a sentence holding it (export/shortlist.py builds it from training data),
plus tokens any sentence may produce (the most frequent targets, eos, unk). A batch decodes over the union of its
sources' lists: the decoder graph gathers those rows of the output projection (its `vocab_rows` input) and
normalises over them, so scores are log-probabilities within the shortlist — what Marian and CTranslate2 compute.

The file (`shortlist.npz`, listed and checksummed in the manifest) holds three integer arrays: `offsets` [V + 1],
`targets` [offsets[-1]] (source token s's list is targets[offsets[s]:offsets[s + 1]]) and `always` [F].
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ExportedModelError

SHORTLIST_FILE = "shortlist.npz"
ARRAYS = ("offsets", "targets", "always")
REBUILD = "re-export the model with `python -m export … shortlist.build=true`"


@dataclass(frozen=True)
class Shortlist:
    """Per source token the target tokens it may produce (CSR: `offsets` [V + 1], `targets`), and `always` [F],
    the tokens every batch may produce. Ids index one vocabulary of `vocab_size` (source and target share it)."""

    offsets: np.ndarray  # [V + 1] int64, non-decreasing, offsets[0] = 0, offsets[-1] = len(targets)
    targets: np.ndarray  # [nnz] int32
    always: np.ndarray  # [F] int32

    @property
    def vocab_size(self) -> int:
        return len(self.offsets) - 1

    def candidates(self, src: np.ndarray, required: tuple[int, ...] = ()) -> np.ndarray:
        """The sorted token ids [C] int64 a batch of sources src [B, S] decodes over: every source token's list,
        `always`, and `required` (the search's eos). Sorted, so that the graph's top-k breaks ties by lower id as
        the full search does."""
        present = np.unique(src)
        present = present[(present >= 0) & (present < self.vocab_size)]
        starts, ends = self.offsets[present], self.offsets[present + 1]
        lists = [self.targets[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True) if b > a]
        ids = np.concatenate([*lists, self.always, np.asarray(required, dtype=np.int32)])
        return np.unique(ids).astype(np.int64)

    def check(self, vocab_size: int) -> None:
        """ExportedModelError unless the arrays are a shortlist over a vocabulary of `vocab_size` ids."""
        o, t, a = self.offsets, self.targets, self.always
        problem = ""
        if any(x.ndim != 1 or x.dtype.kind not in "iu" for x in (o, t, a)):
            problem = "holds arrays that are not 1-D integer arrays"
        elif len(o) != vocab_size + 1:
            problem = f"has offsets for {len(o) - 1} source tokens, the vocabulary has {vocab_size}"
        elif o[0] != 0 or o[-1] != len(t) or np.any(np.diff(o) < 0):
            problem = "has offsets that do not partition its target lists"
        elif any(x.size and (x.min() < 0 or x.max() >= vocab_size) for x in (t, a)):
            problem = f"holds token ids outside the vocabulary [0, {vocab_size})"
        if problem:
            raise ExportedModelError(f"{SHORTLIST_FILE} {problem}; {REBUILD}")

    def save(self, path: Path) -> None:
        """Write the three arrays uncompressed (np.savez: a zip of .npy files, read without pickle)."""
        with path.open("wb") as fh:
            np.savez(fh, offsets=self.offsets, targets=self.targets, always=self.always)

    @classmethod
    def load(cls, path: Path, vocab_size: int) -> Shortlist:
        """Read and check a shortlist file (ExportedModelError naming the problem, never a pickle)."""
        try:
            with np.load(path, allow_pickle=False) as data:
                missing = sorted(set(ARRAYS) - set(data.files))
                if missing:
                    raise ExportedModelError(
                        f"{path.name} lacks {missing}; re-export the model with shortlist.build=true"
                    )
                shortlist = cls(*(np.asarray(data[name]) for name in ARRAYS))
        except (OSError, ValueError, zipfile.BadZipFile) as exc:
            raise ExportedModelError(f"cannot read {path.name}: {str(exc)[:200]}; re-export the model") from None
        shortlist.check(vocab_size)
        return shortlist
