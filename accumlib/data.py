"""Small, offline data: scikit-learn's 8x8 handwritten digits (shipped inside the package) and generated sequences."""
from __future__ import annotations

import functools

import torch

from ._validate import positive_int

PAD = -100  # target value of padding positions; cross_entropy(ignore_index=PAD) skips them


@functools.lru_cache(maxsize=None)
def _digits_arrays():
    from sklearn.datasets import load_digits  # ships with scikit-learn: no download

    digits = load_digits()
    return digits.images, digits.target


def digits(n: int | None = None, *, flat: bool = False, dtype: torch.dtype = torch.float32):
    """The 1,797 handwritten digits as (X, y): X in [0, 1], shape (n, 1, 8, 8) or (n, 64) if flat; y in 0..9.

    n: the first n samples (default all).
    """
    images, target = _digits_arrays()
    if n is not None:
        n = positive_int("n", n)
        if n > len(images):
            raise ValueError(f"n must be between 1 and {len(images)} (the digits dataset size), got {n}")
    X = torch.tensor(images[:n], dtype=dtype).unsqueeze(1) / 16
    y = torch.tensor(target[:n], dtype=torch.long)
    return (X.flatten(1) if flat else X), y


def token_sequences(n: int = 64, *, max_len: int = 12, vocab: int = 16, seed: int = 0):
    """Variable-length sequences for next-token prediction, as (X, y) of shape (n, max_len).

    Lengths are uniform in 2..max_len; X pads with token 0, y pads with PAD so the loss skips padding.
    """
    n, max_len, vocab = positive_int("n", n), positive_int("max_len", max_len), positive_int("vocab", vocab)
    if max_len < 2:
        raise ValueError(f"max_len must be at least 2, got {max_len}")
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (n, max_len + 1), generator=g)
    lengths = torch.randint(2, max_len + 1, (n,), generator=g)
    position = torch.arange(max_len)
    pad = position[None, :] >= lengths[:, None]
    X = tokens[:, :-1].masked_fill(pad, 0)
    y = tokens[:, 1:].masked_fill(pad, PAD)
    return X, y


def count_tokens(x: torch.Tensor, y: torch.Tensor) -> int:
    """Loss terms in a micro-batch: target positions that are not padding."""
    return int((y != PAD).sum())
