"""Small, offline data: 8x8 handwritten digits (shipped inside this package) and generated sequences.

The digits are the UCI "Optical Recognition of Handwritten Digits" test set (E. Alpaydin and C. Kaynak, 1998;
CC BY 4.0), exactly as scikit-learn ships it as `load_digits()`: 1,797 images of 8x8 pixels with values 0..16.
`digits.bin.gz` holds their pixels (uint8, row-major) followed by their labels, so loading needs torch alone.
"""

from __future__ import annotations

import functools
import gzip
from importlib import resources

import torch

from .._validate import positive_int
from ..i18n import _

PAD = -100  # target value of padding positions; cross_entropy(ignore_index=PAD) skips them


DIGITS = 1797  # samples in the shipped digits


@functools.lru_cache(maxsize=None)
def _digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """(images as uint8 of shape (1797, 8, 8) with values 0..16, labels as uint8 of shape (1797,))."""
    raw = gzip.decompress((resources.files(__package__) / "digits.bin.gz").read_bytes())
    pixels = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    return pixels[: DIGITS * 64].view(DIGITS, 8, 8), pixels[DIGITS * 64 :]


def digits(n: int | None = None, *, flat: bool = False, dtype: torch.dtype = torch.float32):
    """The 1,797 handwritten digits as (X, y): X in [0, 1], shape (n, 1, 8, 8) or (n, 64) if flat; y in 0..9.

    n: the first n samples (default all).
    """
    images, target = _digits_arrays()
    if n is not None:
        n = positive_int("n", n)
        if n > len(images):
            raise ValueError(
                _("n must be between 1 and {size} (the digits dataset size), got {n}").format(size=len(images), n=n)
            )
    X = images[:n].to(dtype).unsqueeze(1) / 16
    y = target[:n].long()
    return (X.flatten(1) if flat else X), y


def token_sequences(n: int = 64, *, max_len: int = 12, vocab: int = 16, seed: int = 0):
    """Variable-length sequences for next-token prediction, as (X, y) of shape (n, max_len).

    Lengths are uniform in 2..max_len; X pads with token 0, y pads with PAD so the loss skips padding.
    """
    n, max_len, vocab = positive_int("n", n), positive_int("max_len", max_len), positive_int("vocab", vocab)
    if max_len < 2:
        raise ValueError(_("max_len must be at least 2, got {max_len}").format(max_len=max_len))
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (n, max_len + 1), generator=g)
    lengths = torch.randint(2, max_len + 1, (n,), generator=g)
    position = torch.arange(max_len)
    pad = position[None, :] >= lengths[:, None]
    X = tokens[:, :-1].masked_fill(pad, 0)
    y = tokens[:, 1:].masked_fill(pad, PAD)
    return X, y


def count_tokens(y: torch.Tensor) -> torch.Tensor:
    """Loss terms in a micro-batch, from its target y (what train's count gets): positions that are not padding, as
    a 0-d int64 tensor on y's device (a tensor, not an int: counting reads nothing back to the host)."""
    return (y != PAD).sum()
