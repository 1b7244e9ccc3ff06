"""Language-model data sets: word/char Penn Treebank and enwik8.

Data sets (``highway_repro.data.build(name, ...)``):

* ``ptb_word``: Mikolov's ``ptb.{train,valid,test}.txt``, whitespace words plus
  ``<eos>`` per line; vocabulary 10,000; 929,589 / 73,760 / 82,430 tokens.
  ``tokenizer="sentencepiece"`` (with ``vocab_size``) trains a sentencepiece
  model on the training split instead. ``reader="datasets"`` reads the same
  files through Hugging Face ``datasets.load_dataset("text", ...)`` (identical
  tokens; the default ``"plain"`` reads them directly).
* ``ptb_char``: Mikolov's ``ptb.char.*`` files (characters separated by spaces,
  ``_`` for a space); each line end is one ``<eos>`` token. 5,017,482 /
  393,042 / 442,423 tokens; vocabulary 50 (49 characters + ``<eos>``).
* ``ptb_char_raw``: the R-Transformer / TCN form of char-PTB: the word-level
  ``ptb.*.txt`` files read as a raw character stream (spaces included), each
  line end written as ``<eos>`` -- ONE symbol, so the token count equals the
  file's character count; vocabulary 50.
* ``enwik8``: the 100,000,000 bytes of ``enwik8.zip``; first 90M train, next 5M
  val, last 5M test (split on raw bytes, as ``prep_enwik8.py`` does).
  ``newlines="drop"`` (default) is the Transformer-XL ``prep_enwik8.py``
  convention: newline bytes dropped after the split, vocabulary = the distinct
  remaining byte values (about 204); ``newlines="keep"``: all bytes, vocabulary
  256. The two conventions differ by about 0.02 bpc: report which one is used.
* ``enwik8_prefix``: the 4,154,399-byte prefix of the offline mirror, split
  90/5/5 proportionally (val and test round(5%) each), same ``newlines`` option.

Batching (nanoGPT / Transformer-XL "batchify"): a split of N tokens gives N-1
(input, target) pairs, cut into ``batch_size`` contiguous columns of
L = (N-1) // batch_size pairs (the last < batch_size pairs are dropped).

* ``train_batch(step)``: window ``k = step mod steps_per_epoch`` of every
  column, positions ``[k*score_len, k*score_len + seq_len)``; the trainer scores
  the last ``score_len`` positions. Deterministic: the seed plays no role.
* ``eval_batches(split)``: windows in stream order. Chunk j holds positions
  ``[j*S, (j+1)*S)`` (S = ``eval_score_len``) and its window is the T =
  ``eval_seq_len`` positions ending there, shorter when the stream has less
  history (the first window is just the first S positions). The last chunk may
  be partial (r < S positions); its window is those r positions only (no extra
  context, else they would be scored twice). Rule for the consumer: **score the
  last min(eval_score_len, x.shape[1]) positions of every eval batch**; then
  every pair is scored exactly once, ``num_targets(split)`` in all. With
  S = T the windows are adjacent, as the Transformer-XL memory needs.
"""

from __future__ import annotations

import logging
import math
import zipfile

import numpy as np
import torch

from . import prepared, sources
from .tokenizers import ByteTokenizer, CharTokenizer, SentencePieceTokenizer, WordTokenizer, from_state

log = logging.getLogger(__name__)

SPLIT_FILES = {"train": "train", "val": "valid", "test": "test"}
LM_OPTIONS = ("batch_size", "seq_len", "score_len", "eval_batch_size", "eval_seq_len", "eval_score_len",
              "tokenizer", "seed", "train_limit_tokens", "cache_dir")
ENWIK8_BYTES = 100_000_000
ENWIK8_EVAL_BYTES = 5_000_000


def _columns(stream: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (batch_size, L) views of the stream; targets = inputs shifted by one."""
    L = (len(stream) - 1) // batch_size
    return stream[: batch_size * L].reshape(batch_size, L), stream[1: batch_size * L + 1].reshape(batch_size, L)


def _tensor(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a.astype(np.int64))


class LMData:
    """A language-model data set (see the module docstring for the batching protocol).

    Args: ``batch_size`` (32) and ``seq_len`` (128) for training; ``score_len``
    (default seq_len; R-Transformer: 320 of 400); ``eval_batch_size``,
    ``eval_seq_len`` (default: the train values); ``eval_score_len`` (default:
    eval_seq_len when score_len == seq_len, else min(score_len, eval_seq_len));
    ``seed`` (kept for a uniform interface: LM batches need no randomness);
    ``train_limit_tokens`` keeps the first N training tokens (smoke tests).
    """

    kind = "lm"
    splits = ("val", "test")

    def __init__(self, name: str, streams: dict[str, np.ndarray], tokenizer, *, batch_size: int = 32,
                 seq_len: int = 128, score_len: int | None = None, eval_batch_size: int | None = None,
                 eval_seq_len: int | None = None, eval_score_len: int | None = None, seed: int = 0,
                 train_limit_tokens: int | None = None):
        self.name, self.tokenizer, self.seed = name, tokenizer, seed
        self.meta = {"vocab_size": int(tokenizer.vocab_size)}
        self.streams = dict(streams)
        if train_limit_tokens is not None:
            self.streams["train"] = self.streams["train"][: int(train_limit_tokens)]
        self.batch_size, self.seq_len = int(batch_size), int(seq_len)
        self.score_len = int(score_len if score_len is not None else seq_len)
        self.eval_batch_size = int(eval_batch_size if eval_batch_size is not None else batch_size)
        self.eval_seq_len = int(eval_seq_len if eval_seq_len is not None else seq_len)
        if eval_score_len is None:
            eval_score_len = (self.eval_seq_len if self.score_len == self.seq_len
                              else min(self.score_len, self.eval_seq_len))
        self.eval_score_len = int(eval_score_len)
        for what, s, t in (("", self.score_len, self.seq_len), ("eval_", self.eval_score_len, self.eval_seq_len)):
            if not 1 <= s <= t:
                raise sources.DataError(f"{name}: need 1 <= {what}score_len <= {what}seq_len, got {s} and {t}")
        if self.batch_size < 1 or self.eval_batch_size < 1:
            raise sources.DataError(f"{name}: batch sizes must be >= 1")
        for split, stream in self.streams.items():
            if (len(stream) - 1) // (self.batch_size if split == "train" else self.eval_batch_size) < 1:
                raise sources.DataError(f"{name}: the {split} split has {len(stream)} tokens, "
                                        "too few for its batch size")
        self._train = _columns(self.streams["train"], self.batch_size)
        L = self._train[0].shape[1]
        if L < self.seq_len:
            raise sources.DataError(f"{name}: train split too small: {len(self.streams['train']):,} tokens give "
                             f"columns of {L} < seq_len={self.seq_len} with batch_size={self.batch_size}")
        self.steps_per_epoch = (L - self.seq_len) // self.score_len + 1

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y int64 (batch_size, seq_len): window ``step mod steps_per_epoch`` of every column."""
        o = (int(step) % self.steps_per_epoch) * self.score_len
        x, y = self._train
        return _tensor(x[:, o: o + self.seq_len]), _tensor(y[:, o: o + self.seq_len])

    def _eval_columns(self, split: str):
        if split not in self.streams:
            raise ValueError(f"{self.name}: unknown split {split!r}; available: train, {', '.join(self.splits)}")
        return _columns(self.streams[split], self.eval_batch_size)

    def eval_windows(self, split: str) -> list[tuple[int, int]]:
        """(start, end) column positions of the eval windows; the last min(S, end-start) are scored."""
        L = self._eval_columns(split)[0].shape[1]
        S, T = self.eval_score_len, self.eval_seq_len
        windows = []
        for j in range(math.ceil(L / S)):
            end = min((j + 1) * S, L)
            windows.append((max(0, end - T) if end - j * S == S else j * S, end))
        return windows

    def eval_batches(self, split: str):
        """Yield x, y int64 (eval_batch_size, <= eval_seq_len) in stream order; see the module doc for scoring."""
        x, y = self._eval_columns(split)
        for a, b in self.eval_windows(split):
            yield _tensor(x[:, a:b]), _tensor(y[:, a:b])

    def num_targets(self, split: str) -> int:
        """Number of scored (input, target) pairs in ``eval_batches(split)``."""
        x, _ = self._eval_columns(split)
        return int(x.size)

    def num_tokens(self, split: str) -> int:
        return int(len(self.streams[split]))

    def describe(self) -> str:
        sizes = " / ".join(f"{s} {len(self.streams[s]):,}" for s in ("train",) + self.splits)
        return (f"{self.name}: {self.tokenizer.kind} tokens {sizes}, vocab {self.meta['vocab_size']:,}; "
                f"batch {self.batch_size}x{self.seq_len} (score {self.score_len}), {self.steps_per_epoch} steps/epoch")

    def __repr__(self) -> str:
        return f"<LMData {self.describe()}>"


# ----------------------------------------------------------------------------- data sets

def _read_lines_datasets(path, cache) -> str:
    """Read a text file through HF ``datasets`` (local files only, no Hub)."""
    import datasets

    ds = datasets.load_dataset("text", data_files={"x": str(path)}, split="x",
                               cache_dir=str(sources.cache_dir(cache) / "hf_datasets"))
    return "".join(line + "\n" for line in ds["text"])


def _read_utf8(path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise sources.DataError(f"{path} is not UTF-8 text (byte {e.object[e.start:e.start + 1]!r} at offset "
                                f"{e.start}: {e.reason}); replace it with the data set's text file") from None


def _check_choice(name: str, option: str, value, valid) -> None:
    if value not in valid:
        raise sources.DataError(f"{name}: {option}={value!r} is not valid; choose one of {', '.join(map(str, valid))}")


def _text_stream_data(name: str, folder: str, pattern: str, *, tokenizer: str, valid_tokenizers, reader="plain",
                      vocab_size=None, sp_model_type="unigram", cache_dir=None, **lm) -> LMData:
    _check_choice(name, "tokenizer", tokenizer, valid_tokenizers)
    _check_choice(name, "reader", reader, ("plain", "datasets"))
    if tokenizer == "sentencepiece" and not vocab_size:
        raise sources.DataError(f"{name}: tokenizer=sentencepiece needs vocab_size (e.g. 4000)")
    if tokenizer != "sentencepiece" and vocab_size is not None:
        raise sources.DataError(f"{name}: vocab_size is only for tokenizer=sentencepiece (the {tokenizer} vocabulary "
                         f"is fixed by the data)")
    relpaths = {s: f"{folder}/{pattern.format(f)}" for s, f in SPLIT_FILES.items()}
    key = {"tokenizer": tokenizer, "reader": reader}
    if tokenizer == "sentencepiece":
        key.update(vocab_size=int(vocab_size), sp_model_type=sp_model_type)

    def build(verified, folder):
        paths = {s: verified[r] for s, r in relpaths.items()}
        if reader == "datasets":
            texts = {s: _read_lines_datasets(p, cache_dir) for s, p in paths.items()}
        else:
            texts = {s: _read_utf8(p) for s, p in paths.items()}
        for s, t in texts.items():
            if not t.strip():
                raise sources.DataError(f"{name}: the {s} split ({paths[s]}) is empty")
        if tokenizer == "char":
            tok = CharTokenizer.fit(list(texts.values()), skip_spaces=(name == "ptb_char"))
        elif tokenizer == "word":
            tok = WordTokenizer.fit(texts["train"])
        else:
            model = folder / "tokenizer.model"  # in the prepared folder: its manifest's sha256 covers it
            tok = SentencePieceTokenizer.train(texts["train"], model, int(vocab_size), sp_model_type)
        return {s: tok.encode(t) for s, t in texts.items()}, {"tokenizer": tok.state()}

    streams, info = prepared.load_or_build(name, key, relpaths.values(), build, cache_dir)
    return LMData(name, streams, from_state(info["tokenizer"]), **lm)


def ptb_word(*, tokenizer="word", reader="plain", vocab_size=None, sp_model_type="unigram", cache_dir=None, **lm):
    """Word-level PTB (tokenizer ``word`` or ``sentencepiece``)."""
    return _text_stream_data("ptb_word", "ptb", "ptb.{}.txt", tokenizer=tokenizer,
                             valid_tokenizers=("word", "sentencepiece"), reader=reader, vocab_size=vocab_size,
                             sp_model_type=sp_model_type, cache_dir=cache_dir, **lm)


def ptb_char(*, tokenizer="char", cache_dir=None, **lm):
    """Mikolov's char-PTB files; each line end is one ``<eos>``."""
    return _text_stream_data("ptb_char", "ptb_char", "ptb.char.{}.txt", tokenizer=tokenizer,
                             valid_tokenizers=("char",), cache_dir=cache_dir, **lm)


def ptb_char_raw(*, tokenizer="char", cache_dir=None, **lm):
    """The word-level PTB files as a raw character stream; each line end is one ``<eos>`` symbol."""
    return _text_stream_data("ptb_char_raw", "ptb", "ptb.{}.txt", tokenizer=tokenizer,
                             valid_tokenizers=("char",), cache_dir=cache_dir, **lm)


def _byte_data(name: str, relpath: str, read, split_sizes, *, newlines="drop", tokenizer="byte", cache_dir=None, **lm):
    _check_choice(name, "tokenizer", tokenizer, ("byte",))
    _check_choice(name, "newlines", newlines, ("drop", "keep"))

    def build(verified, folder):
        raw = read(verified[relpath])
        n_val, n_test = split_sizes(len(raw))
        parts = {"train": raw[: len(raw) - n_val - n_test], "val": raw[len(raw) - n_val - n_test: len(raw) - n_test],
                 "test": raw[len(raw) - n_test:]}
        tok = ByteTokenizer.fit(list(parts.values()), newlines)
        return {s: tok.encode(p) for s, p in parts.items()}, {"tokenizer": tok.state()}

    streams, info = prepared.load_or_build(name, {"newlines": newlines}, [relpath], build, cache_dir)
    return LMData(name, streams, from_state(info["tokenizer"]), **lm)


def _read_enwik8(path) -> np.ndarray:
    try:
        with zipfile.ZipFile(path) as z:
            raw = np.frombuffer(z.read("enwik8"), dtype=np.uint8)
    except (zipfile.BadZipFile, KeyError) as e:
        raise sources.DataError(f"{path} is not the canonical enwik8.zip ({e}); delete it and run again")
    if len(raw) != ENWIK8_BYTES:
        raise sources.DataError(f"{path}: enwik8 has {len(raw):,} bytes, expected {ENWIK8_BYTES:,}")
    return raw


def enwik8(*, newlines="drop", tokenizer="byte", cache_dir=None, **lm):
    """Full enwik8, 90M/5M/5M bytes; ``newlines='drop'`` (default, Transformer-XL) or ``'keep'``."""
    return _byte_data("enwik8", "enwik8/enwik8.zip", _read_enwik8, lambda n: (ENWIK8_EVAL_BYTES, ENWIK8_EVAL_BYTES),
                      newlines=newlines, tokenizer=tokenizer, cache_dir=cache_dir, **lm)


def enwik8_prefix(*, newlines="drop", tokenizer="byte", cache_dir=None, **lm):
    """The mirror's 4,154,399-byte enwik8 prefix, split 90/5/5; ``newlines='drop'`` (default) or ``'keep'``."""
    def read(path):
        raw = np.fromfile(path, dtype=np.uint8)
        if len(raw) == 0:
            raise sources.DataError("enwik8/enwik8.prefix is empty")
        return raw

    return _byte_data("enwik8_prefix", "enwik8/enwik8.prefix", read, lambda n: (round(0.05 * n), round(0.05 * n)),
                      newlines=newlines, tokenizer=tokenizer, cache_dir=cache_dir, **lm)
