"""accumlib.checkpoint_parts: the model-and-optimizer part of a checkpoint (FSDP2's shards: test_torchrun.py)."""

import torch
from torch import nn

from accumlib.checkpoint_parts import ShardedState, WholeState, _parts


def test_whole_state_names_each_entry_and_checks_the_saved_tensors_against_it():
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.Adam([model[0].weight], lr=0.1)
    parts = WholeState()
    layout = parts.layout(model, optimizer)
    assert [entry[0] for entry in layout["model"]] == list(model.state_dict())
    assert layout["optimizer"] == "torch.optim.adam.Adam" and layout["groups"] == [["0.weight"]]
    saved = {"layout": layout, **parts.state(model, optimizer)}
    assert parts.problem(saved) is None
    saved["model"] = {**saved["model"], "0.weight": torch.zeros(4, 2)}  # another shape than the layout says
    assert parts.problem(saved) == "'model'"
    assert parts.problem({"layout": layout, "model": saved["model"]}) == "'model', 'optimizer'"


def test_a_model_is_saved_whole_unless_it_is_sharded(tmp_path):
    chosen = _parts(nn.Linear(3, 4), tmp_path / "run.pt")
    assert type(chosen) is WholeState and not chosen.collective
    assert ShardedState.collective
