"""Seeded data for the library's tests: digit-like 8x8 images in ten classes, and padded token sequences."""

import functools

import torch

DIGITS = 1797  # images in the set: digits(n) is its first n, the same n samples in every test
PAD = -100  # a padding target: cross_entropy(ignore_index=PAD) skips it


@functools.cache
def _images() -> tuple[torch.Tensor, torch.Tensor]:
    """(pixels as int64 of shape (DIGITS, 8, 8) with values 0..16, labels of shape (DIGITS,) in 0..9).

    Each class is a fixed random 8x8 pattern; an image is its class's pattern plus noise of at most 4 levels, so a
    model can learn the classes and a held-out part is predictable. Integers: every dtype holds them exactly.
    """
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 10, (DIGITS,), generator=g)
    patterns = torch.randint(0, 17, (10, 8, 8), generator=g)
    noise = torch.randint(-4, 5, (DIGITS, 8, 8), generator=g)
    return (patterns[labels] + noise).clamp(0, 16), labels


def digits(n: int | None = None, *, flat: bool = False, dtype: torch.dtype = torch.float32):
    """The first n images (default all) as (X, y): X in [0, 1] (multiples of 1/16), shape (n, 1, 8, 8), or (n, 64)
    if flat; y the int64 labels. Fresh tensors: a test may change them in place."""
    pixels, labels = _images()
    X = pixels[:n].unsqueeze(1).to(dtype) / 16
    return (X.flatten(1) if flat else X), labels[:n].clone()


def token_sequences(n: int, *, max_len: int = 12, vocab: int = 16, seed: int = 0):
    """n sequences for next-token prediction as (X, y) of shape (n, max_len), lengths 2..max_len drawn from seed:
    X pads with token 0 and y with PAD after a sequence's end, so a loss with ignore_index=PAD counts only tokens."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (n, max_len + 1), generator=g)
    lengths = torch.randint(2, max_len + 1, (n, 1), generator=g)
    padding = torch.arange(max_len) >= lengths
    return tokens[:, :-1].masked_fill(padding, 0), tokens[:, 1:].masked_fill(padding, PAD)


def count_tokens(y: torch.Tensor) -> torch.Tensor:
    """train's count= for token_sequences: the targets that are not padding, a 0-d tensor (no host read)."""
    return (y != PAD).sum()
