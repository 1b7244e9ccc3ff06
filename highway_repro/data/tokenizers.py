"""Tokenizers for the language-model data sets: char, word, byte, sentencepiece.

All of them turn text (or bytes) into a compact numpy id array (uint8 when the
vocabulary has at most 256 symbols, else uint16 / int32) and back, and can be
saved in the data cache as a small JSON ``state()`` and rebuilt with
:func:`from_state`.

Line ends: every tokenizer maps one line end to ONE end-of-line symbol
``<eos>`` (word-PTB convention: ``line.split() + ['<eos>']``), except the byte
tokenizer, which keeps or drops newline bytes (enwik8 conventions).
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from highway_repro.errors import make_folder

from .sources import DataError

log = logging.getLogger(__name__)

EOS = "<eos>"


def compact(ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """Store ids in the smallest dtype that holds ``vocab_size`` symbols."""
    dtype = np.uint8 if vocab_size <= 256 else np.uint16 if vocab_size <= 65536 else np.int32
    return np.ascontiguousarray(ids, dtype=dtype)


def _byte_counts(a) -> np.ndarray:
    """Histogram (256,) of the byte values of a uint8 array; counts byte pairs (uint16), half the work."""
    a = np.ascontiguousarray(a, np.uint8).ravel()
    n2 = len(a) // 2 * 2
    c = np.bincount(a[:n2].view(np.uint16), minlength=65536).reshape(256, 256)
    counts = c.sum(0) + c.sum(1)  # low bytes + high bytes of the pairs
    if n2 < len(a):
        counts[a[-1]] += 1
    return counts


def _lines(text: str) -> list[str]:
    """Lines as ``for line in file`` gives them (a final line end does not open a new line)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


class CharTokenizer:
    """One id per character; a line end is the single symbol ``<eos>``.

    ``skip_spaces=True`` reads Mikolov's ``ptb.char.*`` files, where characters
    are separated by spaces (and ``_`` stands for a space in the text).
    Symbols are ordered by code point.
    """

    kind = "char"

    def __init__(self, symbols: list[str], skip_spaces: bool = False):
        self.symbols = list(symbols)
        self.skip_spaces = skip_spaces
        self._codes = np.array([10 if s == EOS else ord(s) for s in self.symbols], dtype=np.uint32)
        if np.any(np.diff(self._codes.astype(np.int64)) <= 0):
            raise ValueError("CharTokenizer symbols must be sorted by code point and distinct")
        self.vocab_size = len(self.symbols)

    @staticmethod
    def _codepoints(text: str, skip_spaces: bool) -> np.ndarray:
        cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        return cps[cps != 32] if skip_spaces else cps

    @classmethod
    def fit(cls, texts: list[str], skip_spaces: bool = False) -> "CharTokenizer":
        """Vocabulary = the distinct characters of all ``texts``."""
        codes = np.unique(np.concatenate([np.unique(cls._codepoints(t, skip_spaces)) for t in texts]))
        return cls([EOS if c == 10 else chr(c) for c in codes.tolist()], skip_spaces)

    def encode(self, text: str) -> np.ndarray:
        cps = self._codepoints(text, self.skip_spaces)
        ids = np.searchsorted(self._codes, cps).clip(max=len(self._codes) - 1)
        bad = self._codes[ids] != cps
        if bad.any():
            unknown = sorted({chr(c) for c in cps[bad][:1000].tolist()})
            raise DataError(f"characters not in the vocabulary: {unknown!r}")
        return compact(ids, self.vocab_size)

    def decode(self, ids) -> str:
        return "".join("\n" if self.symbols[i] == EOS else self.symbols[i] for i in np.asarray(ids).tolist())

    def state(self) -> dict:
        return {"kind": self.kind, "symbols": self.symbols, "skip_spaces": self.skip_spaces}


class WordTokenizer:
    """Whitespace words, ``<eos>`` appended per line (Mikolov / Zaremba PTB).

    The vocabulary comes from the training text in order of first appearance.
    Words missing from it map to ``<unk>`` if the vocabulary has one, else raise.
    """

    kind = "word"

    def __init__(self, words: list[str]):
        self.words = list(words)
        self.index = {w: i for i, w in enumerate(self.words)}
        self.vocab_size = len(self.words)

    @classmethod
    def fit(cls, text: str) -> "WordTokenizer":
        seen: dict[str, None] = {}
        for line in _lines(text):
            seen.update(dict.fromkeys(line.split()))
            seen.setdefault(EOS)
        return cls(list(seen))

    def encode(self, text: str) -> np.ndarray:
        tokens = [w for line in _lines(text) for w in line.split() + [EOS]]
        try:
            ids = [self.index[w] for w in tokens]
        except KeyError:
            unk = self.index.get("<unk>")
            missing = sorted({w for w in tokens if w not in self.index})
            if unk is None:
                raise DataError(f"{len(missing)} words not in the vocabulary, e.g. {missing[:5]}") from None
            ids = [self.index.get(w, unk) for w in tokens]
        return compact(np.array(ids, dtype=np.int64), self.vocab_size)

    def decode(self, ids) -> str:
        out, line = [], []
        for i in np.asarray(ids).tolist():
            if self.words[i] == EOS:
                out.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(self.words[i])
        return "".join(out) + " ".join(line)

    def state(self) -> dict:
        return {"kind": self.kind, "words": self.words}


class ByteTokenizer:
    """Bytes (enwik8).

    ``newlines="keep"``: id = byte value, vocabulary 256.
    ``newlines="drop"``: the Transformer-XL / awd-lstm ``prep_enwik8.py``
    convention: newline bytes (0x0A) are removed and the vocabulary is the
    distinct remaining byte values of the data (204 on full enwik8), in byte
    order.
    """

    kind = "byte"

    def __init__(self, newlines: str = "drop", codes: list[int] | None = None):
        if newlines not in ("drop", "keep"):
            raise ValueError(f"newlines must be 'drop' or 'keep', got {newlines!r}")
        self.newlines = newlines
        self.codes = list(range(256)) if newlines == "keep" else sorted(codes or [])
        self._table = np.full(256, -1, dtype=np.int64)
        self._table[self.codes] = np.arange(len(self.codes))
        self.vocab_size = len(self.codes)
        # byte -> id as a bytes.translate table; 255 marks bytes outside the vocabulary (with newlines
        # dropped the vocabulary has at most 255 symbols, so 255 is never an id)
        self._lut = bytes(int(i) if i >= 0 else 255 for i in self._table) if newlines == "drop" else None

    @classmethod
    def fit(cls, arrays: list[np.ndarray], newlines: str = "drop") -> "ByteTokenizer":
        counts = sum(_byte_counts(a) for a in arrays)
        counts[10] = 0 if newlines == "drop" else counts[10]
        return cls(newlines, np.flatnonzero(counts).tolist())

    def encode(self, data) -> np.ndarray:
        if self.newlines == "keep":  # id = byte value
            return np.array(np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray)) else data,
                            dtype=np.uint8)
        raw = data if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data, np.uint8).tobytes()
        ids = np.frombuffer(bytearray(raw.translate(self._lut, b"\n")), np.uint8)  # map + drop newlines, one C pass
        if ids.size and ids.max() == 255:
            arr = np.frombuffer(raw, np.uint8)
            arr = arr[arr != 10]
            raise DataError(f"byte values not in the vocabulary: {sorted(set(arr[ids == 255][:1000].tolist()))}")
        return compact(ids, self.vocab_size)

    def decode(self, ids) -> str:
        return bytes(np.asarray(self.codes, dtype=np.uint8)[np.asarray(ids)]).decode("utf-8", "replace")

    def state(self) -> dict:
        return {"kind": self.kind, "newlines": self.newlines, "codes": self.codes}


class SentencePieceTokenizer:
    """A sentencepiece model trained on the training split; ``<eos>`` (id 2) appended per line.

    ``<unk>`` written in the text (PTB) is kept as one piece (a user-defined
    symbol); sentencepiece's own unknown piece is ``<sp_unk>`` (id 0).
    """

    kind = "sentencepiece"

    def __init__(self, model_file: str | os.PathLike):
        import sentencepiece as spm

        self.model_file = str(model_file)
        self.sp = spm.SentencePieceProcessor(model_file=self.model_file)
        self.vocab_size = self.sp.get_piece_size()
        self.eos_id = self.sp.eos_id()

    @classmethod
    def train(cls, text: str, model_file: str | os.PathLike, vocab_size: int, model_type: str = "unigram",
              user_symbols: tuple[str, ...] = ("<unk>",)) -> "SentencePieceTokenizer":
        """Train on the lines of ``text``; write ``model_file`` atomically (temp prefix + os.replace)."""
        import sentencepiece as spm

        model_file = Path(model_file)
        make_folder(model_file.parent)
        with tempfile.TemporaryDirectory(dir=model_file.parent) as tmp:
            prefix = os.path.join(tmp, "sp")
            try:
                spm.SentencePieceTrainer.train(
                    sentence_iterator=iter([line for line in _lines(text) if line.strip()]),
                    model_prefix=prefix, vocab_size=vocab_size, model_type=model_type,
                    character_coverage=1.0, normalization_rule_name="identity",
                    unk_id=0, bos_id=-1, eos_id=2, pad_id=-1, unk_piece="<sp_unk>", eos_piece=EOS,
                    user_defined_symbols=[s for s in user_symbols if s in text],
                    num_threads=os.cpu_count() or 1, minloglevel=2)
            except RuntimeError as e:
                raise DataError(f"sentencepiece training failed (vocab_size={vocab_size}, "
                                 f"model_type={model_type}): {str(e).strip().splitlines()[-1]}") from None
            os.replace(prefix + ".model", model_file)
        return cls(model_file)

    def encode(self, text: str) -> np.ndarray:
        pieces = self.sp.encode(_lines(text))
        ids = [i for line in pieces for i in line + [self.eos_id]]
        return compact(np.array(ids, dtype=np.int64), self.vocab_size)

    def decode(self, ids) -> str:
        ids = np.asarray(ids).tolist()
        lines, cur = [], []
        for i in ids:
            if i == self.eos_id:
                lines.append(self.sp.decode(cur))
                cur = []
            else:
                cur.append(i)
        return "\n".join(lines) + ("\n" if lines and not cur else "") + (self.sp.decode(cur) if cur else "")

    def state(self) -> dict:
        return {"kind": self.kind, "model_file": self.model_file}


KINDS = {"char": CharTokenizer, "word": WordTokenizer, "byte": ByteTokenizer, "sentencepiece": SentencePieceTokenizer}


def from_state(state: dict):
    """Rebuild a tokenizer from its ``state()``."""
    kind = state["kind"]
    if kind == "char":
        return CharTokenizer(state["symbols"], state["skip_spaces"])
    if kind == "word":
        return WordTokenizer(state["words"])
    if kind == "byte":
        return ByteTokenizer(state["newlines"], state["codes"])
    if kind == "sentencepiece":
        return SentencePieceTokenizer(state["model_file"])
    raise ValueError(f"unknown tokenizer kind {kind!r}; valid: {', '.join(KINDS)}")
