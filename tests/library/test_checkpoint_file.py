"""accumlib.checkpoint_file: a checkpoint's file is written whole or not at all, and read only when every part
matches its checksum (train's runs through it: tests/library/test_checkpoint.py)."""

import os
import zipfile

import pytest
import torch

from accumlib import StepRecord, checkpoint_file
from accumlib.checkpoint_parts import WholeState


def test_an_interrupted_write_leaves_the_previous_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    path = tmp_path / "run.pt"
    checkpoint_file._write_atomically(path, {"step": 1})
    save = torch.save

    def interrupted(payload, file, *args, **kwargs):
        file.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_file._write_atomically(path, {"step": 2})
    monkeypatch.setattr(torch, "save", save)
    assert os.listdir(tmp_path) == ["run.pt"] and torch.load(path, weights_only=True) == {"step": 1}
    checkpoint_file._write_atomically(path, {"step": 3})
    assert os.listdir(tmp_path) == ["run.pt"] and torch.load(path, weights_only=True) == {"step": 3}


def test_a_changed_byte_is_refused_by_its_checksum_before_torch_load_reads_it(tmp_path):
    """torch.load alone would load the changed tensor as it is: the part's CRC-32 refuses it, naming the file."""
    path = tmp_path / "run.pt"
    torch.save({"weights": torch.arange(1000, dtype=torch.float64)}, path)
    with zipfile.ZipFile(path) as archive:
        largest = max(archive.infolist(), key=lambda info: info.file_size)
        record = archive.read(largest)
    data = bytearray(path.read_bytes())
    data[data.find(record) + len(record) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert torch.load(path, weights_only=True)["weights"].shape == (1000,)  # unrefused without the check
    with pytest.raises(
        ValueError,
        match=rf"checkpoint '{path}' cannot be resumed: it is damaged: its part "
        rf"'.*' does not match its checksum; nothing was changed",
    ):
        checkpoint_file._load(path, StepRecord, WholeState())


def test_a_file_of_another_form_is_refused_naming_the_first_part_that_is_wrong(tmp_path):
    path = tmp_path / "run.pt"
    torch.save({"format": checkpoint_file.FORMAT, "version": checkpoint_file.VERSION}, path)
    with pytest.raises(
        ValueError,
        match=r"it is not an accumlib checkpoint of this version, or it is damaged: "
        r"'run'",
    ):
        checkpoint_file._load(path, StepRecord, WholeState())
