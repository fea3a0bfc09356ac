"""accumlib.failures: under DDP a failure on one process is told to every process before a collective it would never
reach. One process here (a gloo group of one); two processes that fail apart: test_torchrun.py."""

import pytest
import torch
import torch.distributed as dist

from accumlib import failures


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_an_error_before_the_agreement_is_told_and_raised_as_it_was(group):
    with pytest.raises(ValueError, match="^a micro-batch failed$"), failures._Told(torch.device("cpu")):
        raise ValueError("a micro-batch failed")  # told (one all-reduce of the flags), then raised unchanged
    assert failures._told(ValueError("a micro-batch failed"), [0]) == "process 0: ValueError: a micro-batch failed"


def test_after_the_agreement_an_error_is_this_processs_own(monkeypatch):
    agreed = []
    monkeypatch.setattr(failures, "_agree", lambda error, device: agreed.append(error))
    with pytest.raises(RuntimeError), failures._Told(torch.device("cpu")) as told:
        told.agree()  # every process came this far: the all-reduce in backward() can run
        told.pending = False  # past the micro-batches
        raise RuntimeError("the step failed")
    assert agreed == [None]  # the agreement only: the error is not told again
