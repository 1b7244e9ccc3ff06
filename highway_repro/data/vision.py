"""Image classification data sets: MNIST, CIFAR-10, CIFAR-100.

Images are kept as uint8 tensors (N, C, H, W); each batch is converted to
float32 and normalised on the fly:

* MNIST: ``normalize="scale"`` (default) x/255, or ``"caffe"`` x/256 (the
  ``scale: 0.00390625`` of the official Caffe code, Table 1 nets).
* CIFAR: ``normalize="gcn"`` (default, the Highway paper's preprocessing):
  global contrast normalisation per image (x/255, minus the image's mean, divided
  by its standard deviation over all pixels and channels), then the per-pixel
  mean of the (normalised) training images is subtracted. ``"scale"``: x/255.
* ``augment=True``: the data set's standard augmentation (``AUGMENT``), vectorised over
  the batch. CIFAR (Highway Table 3): zero-pad 8 px on each side (after normalisation,
  so the pad value is the mean for ``gcn``), random 32x32 crop, horizontal flip with
  probability 1/2. MNIST (not in the paper; our cpu-scale gate-analysis recipe):
  random translation by up to 2 px each way (zero-pad 2, random 28x28 crop: the pad
  is background under ``scale``/``caffe``), no flip.

Sampling: epoch e uses a fresh permutation seeded by (seed, e); batch b of that
epoch is positions [b*B, (b+1)*B) of it (the last partial batch is dropped);
augmentation is seeded by (seed, step). So ``train_batch(step)`` is a pure
function of (seed, step). ``val_size`` > 0 holds out the LAST val_size training
images as the ``val`` split; ``train_limit`` then keeps the first N remaining
training images.

CIFAR pickles are read with a restricted unpickler that only allows numpy
array reconstruction, so a malicious pickle is never executed.
"""

from __future__ import annotations

import gzip
import logging
import pickle

import numpy as np
import torch

from . import prepared, sources

log = logging.getLogger(__name__)

VISION_OPTIONS = ("batch_size", "eval_batch_size", "seed", "val_size", "augment", "normalize", "train_limit",
                  "cache_dir")
AUGMENT = {"mnist": (2, False), "cifar10": (8, True), "cifar100": (8, True)}  # name -> (pad px, random h-flip)


# ----------------------------------------------------------------------------- readers

class UnsafePickleError(sources.DataError):
    """A pickle asked for something other than numpy array reconstruction."""


class _RestrictedUnpickler(pickle.Unpickler):
    """Allows only the globals the canonical CIFAR pickles need (numpy arrays and dtypes)."""

    def __init__(self, file, name: str):
        super().__init__(file, encoding="bytes")
        self.name = name

    def find_class(self, module, name):
        key = (module, name)
        if key in _allowed():
            return _allowed()[key]
        raise UnsafePickleError(f"{self.name}: refusing to load: the pickle asks for {module}.{name}, which a CIFAR "
                                f"file never needs (only numpy array reconstruction is allowed); the file is not "
                                f"a canonical CIFAR pickle")


def _latin1_encode(obj, encoding="utf-8"):
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise UnsafePickleError(f"refusing _codecs.encode({type(obj).__name__}, {encoding!r}) in a CIFAR pickle")
    return obj.encode("latin1")


def _allowed() -> dict:
    try:
        from numpy._core import multiarray, numeric  # numpy >= 2
    except ImportError:  # pragma: no cover
        from numpy.core import multiarray, numeric

    table = {}
    for mod in ("numpy.core", "numpy._core"):
        table[(f"{mod}.multiarray", "_reconstruct")] = multiarray._reconstruct
        table[(f"{mod}.multiarray", "scalar")] = multiarray.scalar
        table[(f"{mod}.numeric", "_frombuffer")] = numeric._frombuffer
    table[("_codecs", "encode")] = _latin1_encode  # Python 3 protocol-2 pickles write bytes this way
    table[("numpy", "ndarray")] = np.ndarray
    table[("numpy", "dtype")] = np.dtype
    return table


def read_cifar_pickle(path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (N, 3, 32, 32), labels uint8 (N,)) from one canonical CIFAR pickle."""
    with open(path, "rb") as f:
        try:
            d = _RestrictedUnpickler(f, str(path)).load()
        except UnsafePickleError:
            raise
        except Exception as e:
            raise sources.DataError(f"{path}: not a readable CIFAR pickle ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict) or b"data" not in d or label_key not in d:
        keys = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise sources.DataError(f"{path}: wrong format: expected a dict with keys b'data' and {label_key!r}, "
                                f"found {keys}")
    data, labels = np.asarray(d[b"data"]), np.asarray(d[label_key])
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8 or len(labels) != len(data):
        raise sources.DataError(f"{path}: wrong format: b'data' is {data.shape} {data.dtype} (want N x 3072 uint8) "
                                f"with {len(labels)} labels")
    if len(data) == 0:
        raise sources.DataError(f"{path}: holds no images")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.uint8)


def read_idx(path) -> np.ndarray:
    """An idx file (MNIST), gzip'd or not, with magic-number and size checks."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise sources.DataError(f"{path}: broken gzip data ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or not 1 <= raw[3] <= 4:
        raise sources.DataError(f"{path}: not an idx file of uint8 (magic number {raw[:4].hex() or 'missing'}, "
                                f"want 000008NN); is it the right file?")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise sources.DataError(f"{path}: idx header says {shape} ({int(np.prod(shape))} bytes), body has {body.size}")
    if shape[0] == 0:
        raise sources.DataError(f"{path}: holds no items")
    return body.reshape(shape)


# ----------------------------------------------------------------------------- the data object

def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, np.uint64)[0] >> 1)


class ImageData:
    """An image classification data set (see the module docstring)."""

    kind = "classification"

    def __init__(self, name: str, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray],
                 num_classes: int, *, normalize: str, normalizations: tuple[str, ...], batch_size: int = 100,
                 eval_batch_size: int = 1000, seed: int = 0, val_size: int = 0, augment: bool = False,
                 train_limit: int | None = None):
        if normalize not in normalizations:
            raise sources.DataError(f"{name}: normalize={normalize!r} is not valid; "
                                    f"choose one of {', '.join(normalizations)}")
        if augment and name not in AUGMENT:
            raise sources.DataError(f"{name}: augment=True is not defined for it; defined for {', '.join(AUGMENT)}")
        self.name, self.seed, self.normalize, self.augment = name, int(seed), normalize, bool(augment)
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        x, y = train
        val_size = int(val_size or 0)
        if not 0 <= val_size < len(x):
            raise sources.DataError(f"{name}: val_size={val_size} must be in [0, {len(x)}) (training images)")
        data = {}
        if val_size:
            data["val"] = (x[len(x) - val_size:], y[len(y) - val_size:])
            x, y = x[: len(x) - val_size], y[: len(y) - val_size]
        if train_limit is not None:
            x, y = x[: int(train_limit)], y[: int(train_limit)]
        data["train"], data["test"] = (x, y), test
        for split, (xs, _) in data.items():
            if len(xs) == 0:
                raise sources.DataError(f"{name}: the {split} split is empty")
        self.data = {s: (torch.from_numpy(np.require(a, np.uint8, ["C", "W"])), torch.from_numpy(b.astype(np.int64)))
                     for s, (a, b) in data.items()}
        self.splits = ("val", "test") if val_size else ("test",)
        self.meta = {"num_classes": int(num_classes), "input_shape": tuple(int(d) for d in x.shape[1:])}
        n = len(self.data["train"][0])
        if n < self.batch_size:
            raise sources.DataError(f"{name}: {n} training images are fewer than batch_size={self.batch_size}")
        self.steps_per_epoch = n // self.batch_size
        self._perm_cache: tuple[int, torch.Tensor] | None = None
        self.pixel_mean = self._pixel_mean() if normalize == "gcn" else None

    # -- normalisation
    @staticmethod
    def _gcn(x: torch.Tensor) -> torch.Tensor:
        x = x.float() / 255.0
        x = x - x.mean(dim=(1, 2, 3), keepdim=True)
        return x / x.std(dim=(1, 2, 3), keepdim=True).clamp_min(1e-8)  # unbiased std, as in _pixel_mean

    def _pixel_mean(self) -> torch.Tensor:
        """Mean over training images of gcn(x), as sum_i (x_i - mu_i) / s_i: one matrix-vector product per chunk."""
        x = self.data["train"][0]
        total = torch.zeros(x[0].numel(), dtype=torch.float64)
        for i in range(0, len(x), 5000):
            xf = x[i: i + 5000].reshape(-1, total.numel()).float() / 255.0
            var, mu = torch.var_mean(xf, dim=1)
            w = 1.0 / var.sqrt().clamp_min(1e-8)
            total += (w @ xf).double() - (mu * w).double().sum()
        return (total / len(x)).float().reshape(x.shape[1:])

    def _float(self, x: torch.Tensor) -> torch.Tensor:
        if self.normalize == "scale":
            return x.float() / 255.0
        if self.normalize == "caffe":
            return x.float() / 256.0
        return self._gcn(x) - self.pixel_mean

    @staticmethod
    def _pad_crop_flip(x: torch.Tensor, gen: torch.Generator, p: int = 8, flip: bool = True) -> torch.Tensor:
        """x (B, C, H, W) -> (B, C, H, W): zero-pad `p` px, random crop per image, random h-flip if `flip`."""
        B, C, H, W = x.shape
        padded = torch.nn.functional.pad(x, (p, p, p, p))
        oy = torch.randint(0, 2 * p + 1, (B,), generator=gen)
        ox = torch.randint(0, 2 * p + 1, (B,), generator=gen)
        cols = ox[:, None] + torch.arange(W)[None, :]                       # (B, W)
        if flip:
            mirror = torch.rand(B, generator=gen) < 0.5
            cols = torch.where(mirror[:, None], cols.flip(1), cols)         # mirrored read = horizontal flip
        rows = oy[:, None] + torch.arange(H)[None, :]                       # (B, H)
        b = torch.arange(B)[:, None, None, None]
        c = torch.arange(C)[None, :, None, None]
        return padded[b, c, rows[:, None, :, None], cols[:, None, None, :]]

    # -- the interface
    def _perm(self, epoch: int) -> torch.Tensor:
        if self._perm_cache is None or self._perm_cache[0] != epoch:
            gen = torch.Generator().manual_seed(_seed(self.seed, epoch, 0))
            self._perm_cache = (epoch, torch.randperm(len(self.data["train"][0]), generator=gen))
        return self._perm_cache[1]

    def train_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """x float32 (B, C, H, W) normalised (and augmented), y int64 (B,) for global step ``step``."""
        epoch, b = divmod(int(step), self.steps_per_epoch)
        idx = self._perm(epoch)[b * self.batch_size: (b + 1) * self.batch_size]
        x, y = self.data["train"]
        xb = self._float(x[idx])
        if self.augment:
            pad, flip = AUGMENT[self.name]
            xb = self._pad_crop_flip(xb, torch.Generator().manual_seed(_seed(self.seed, step, 1)), pad, flip)
        return xb, y[idx]

    def eval_batches(self, split: str):
        """The whole split in order, no augmentation; the last batch may be smaller. ``"train"`` is allowed."""
        if split not in self.data:
            raise ValueError(f"{self.name}: unknown split {split!r}; available: train, {', '.join(self.splits)}"
                             + ("" if "val" in self.data else " (set val_size > 0 for a val split)"))
        x, y = self.data[split]
        for i in range(0, len(x), self.eval_batch_size):
            yield self._float(x[i: i + self.eval_batch_size]), y[i: i + self.eval_batch_size]

    def num_examples(self, split: str) -> int:
        return len(self.data[split][0])

    def describe(self) -> str:
        sizes = " / ".join(f"{s} {len(self.data[s][0]):,}" for s in ("train",) + self.splits)
        return (f"{self.name}: images {sizes}, {self.meta['num_classes']} classes, shape {self.meta['input_shape']}, "
                f"normalize={self.normalize}, augment={self.augment}")

    def __repr__(self) -> str:
        return f"<ImageData {self.describe()}>"


# ----------------------------------------------------------------------------- data sets

def mnist(*, normalize: str = "scale", cache_dir=None, **kw) -> ImageData:
    """MNIST, 60,000 train / 10,000 test, (1, 28, 28); normalize ``scale`` (x/255, default) or ``caffe`` (x/256)."""
    files = {f"{s}_{k}": f"mnist/{p}-{k if k == 'labels' else 'images'}-idx{1 if k == 'labels' else 3}-ubyte.gz"
             for s, p in (("train", "train"), ("test", "t10k")) for k in ("images", "labels")}

    def build(paths, folder):
        arrays = {k: read_idx(paths[r]) for k, r in files.items()}
        for s in ("train", "test"):
            if arrays[f"{s}_images"].ndim != 3 or len(arrays[f"{s}_images"]) != len(arrays[f"{s}_labels"]):
                raise sources.DataError(f"mnist: {files[s + '_images']} and {files[s + '_labels']} do not match")
            arrays[f"{s}_images"] = arrays[f"{s}_images"][:, None]
        return arrays, {}

    a, _ = prepared.load_or_build("mnist", {}, files.values(), build, cache_dir)
    return ImageData("mnist", (a["train_images"], a["train_labels"]), (a["test_images"], a["test_labels"]), 10,
                     normalize=normalize, normalizations=("scale", "caffe"), **kw)


def _cifar(name: str, train_files: list[str], test_file: str, label_key: bytes, num_classes: int,
           allow_partial: bool, normalize: str, cache_dir, kw) -> ImageData:
    present, missing, failed = [], [], None
    for rel in train_files:
        if sources.locate(rel, cache_dir) is None and failed is None:
            try:  # downloads the canonical archive when a network exists
                sources.fetch(rel, cache_dir)
            except sources.DataNotFoundError as e:
                failed = e
        (present if sources.locate(rel, cache_dir) is not None else missing).append(rel)
    if missing and not allow_partial:
        raise sources.DataNotFoundError(f"{failed} (or pass allow_partial=True to train on the {len(present)} of "
                                        f"{len(train_files)} training files present)")
    if not present:
        raise failed
    files = present + [test_file]

    def build(paths, folder):
        out = {}
        for key, rels in (("train", present), ("test", [test_file])):
            parts = [read_cifar_pickle(paths[r], label_key) for r in rels]
            out[f"{key}_images"] = np.concatenate([p[0] for p in parts])
            out[f"{key}_labels"] = np.concatenate([p[1] for p in parts])
        return out, {}

    a, _ = prepared.load_or_build(name, {}, files, build, cache_dir)
    if missing:
        log.warning("%s: allow_partial: using %d of %d training files (%d training images); missing: %s",
                    name, len(present), len(train_files), len(a["train_images"]), ", ".join(missing))
    return ImageData(name, (a["train_images"], a["train_labels"]), (a["test_images"], a["test_labels"]), num_classes,
                     normalize=normalize, normalizations=("gcn", "scale"), **kw)


def cifar10(*, normalize: str = "gcn", allow_partial: bool = False, cache_dir=None, **kw) -> ImageData:
    """CIFAR-10, 50,000 train / 10,000 test; ``allow_partial=True`` uses the data_batch_N files present."""
    base = "cifar10/cifar-10-batches-py/"
    return _cifar("cifar10", [f"{base}data_batch_{i}" for i in range(1, 6)], base + "test_batch", b"labels", 10,
                  allow_partial, normalize, cache_dir, kw)


def cifar100(*, normalize: str = "gcn", allow_partial: bool = False, cache_dir=None, **kw) -> ImageData:
    """CIFAR-100 (fine labels), 50,000 train / 10,000 test."""
    base = "cifar100/cifar-100-python/"
    return _cifar("cifar100", [base + "train"], base + "test", b"fine_labels", 100, allow_partial, normalize,
                  cache_dir, kw)
