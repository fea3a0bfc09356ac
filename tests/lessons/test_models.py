"""accumlib.lessons.models, the lessons' model builders: bad sizes, kinds, seeds and dtypes are refused with the
right error type and a message naming the parameter, and a refusal leaves the global RNG as it was."""

import pytest
import torch

from accumlib.lessons import models

CASES = {  # id: (call, error type, the parameter its message must name)
    "cnn: unknown norm": (lambda: models.cnn(norm="bn"), ValueError, "norm"),
    "cnn: zero channels": (lambda: models.cnn(channels=(0, 4)), ValueError, "channels"),
    "cnn: channels a number": (lambda: models.cnn(channels=16), TypeError, "channels"),
    "cnn: GroupNorm channels not multiples of 4": (
        lambda: models.cnn(norm="group", channels=(16, 30)),
        ValueError,
        "channels",
    ),
    "cnn: seed as text": (lambda: models.cnn(seed="a"), TypeError, "seed"),
    "cnn: integer dtype": (lambda: models.cnn(dtype=torch.int64), TypeError, "dtype"),
    "mlp: hidden 0": (lambda: models.mlp(hidden=0), ValueError, "hidden"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_naming_the_parameter_and_the_rng_is_untouched(case):
    call, error, parameter = CASES[case]
    before = torch.random.get_rng_state()
    with pytest.raises(error) as info:
        call()
    assert parameter in str(info.value)
    assert torch.equal(before, torch.random.get_rng_state())
