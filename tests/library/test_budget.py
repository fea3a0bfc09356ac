"""accumlib.budget: what a simulated small card means on CUDA (issue 20), tested without a GPU: the allocator's
512-byte blocks in the live-tensor count (fake 'cuda' storages, which FakeTensorMode makes in this CPU build), and
cuda_budget's hard cap with torch.cuda mocked (every call it makes recorded). Only benchmarks/gpu_check.py on a GPU
confirms that the real allocator behaves so; these tests pin what accumlib asks of it."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from accumlib import budget, memory, tracker as tracking

MIB = 2**20


def test_a_cuda_storage_counts_the_allocators_512_byte_blocks_and_a_cpu_one_its_bytes():
    sizes = (0, 1, 127, 128, 129, 1000)  # float32 elements: 0, 4, 508, 512, 516, 4000 bytes
    for device, expected in (("cuda", [0, 512, 512, 512, 1024, 4096]), ("cpu", [0, 4, 508, 512, 516, 4000])):
        with FakeTensorMode():
            tensors = [torch.empty(n, device=device) for n in sizes]
            counts = []
            for t in tensors:
                tracker = tracking.LiveTensorBytes()
                tracker.track([t, t])  # a storage is counted once (slicing a fake cuda tensor needs CUDA)
                counts.append(tracker.current)
        assert counts == expected, device


class FakeCuda:
    """The torch.cuda calls cuda_budget and step_peak make, on a pretend 80 GiB card: reserved and allocated bytes
    as set, every memory-fraction call recorded."""

    def __init__(self, monkeypatch, *, reserved=300 * MIB, allocated=0, peak=0, fraction=1.0):
        self.reserved, self.allocated, self.peak, self.fractions, self.workspaces = reserved, allocated, peak, [], 0
        self.total, self.fraction = 80 * 2**30, fraction  # the fraction in force (1.0: none set)
        for name, value in {
            "synchronize": lambda device=None: None,
            "memory_reserved": lambda device=None: self.reserved,
            "memory_allocated": lambda device=None: self.allocated,
            "max_memory_allocated": lambda device=None: self.peak,
            "reset_peak_memory_stats": lambda device=None: None,
            "get_device_properties": lambda device=None: type("Properties", (), {"total_memory": self.total}),
            "set_per_process_memory_fraction": self.set_fraction,
            "get_per_process_memory_fraction": lambda device=None: self.fraction,
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(budget, "_take_workspaces", lambda device: setattr(self, "workspaces", self.workspaces + 1))

    def set_fraction(self, fraction, device=None):
        self.fraction = fraction
        self.fractions.append(fraction)


CUDA = torch.device("cuda")


@pytest.mark.parametrize("budget", [512 * 1024, 2 * MIB, budget.CUDA_CAP_MINIMUM - 1])
def test_a_budget_below_the_allocators_granularity_is_not_a_hard_cap(monkeypatch, budget):
    # lessons 1 and 5's cards (2 MiB, 0.5 MiB): check_fits's trace alone enforces them; a cap there would refuse
    # steps the trace found within the budget (a 2 MiB segment, cuBLAS's workspace)
    cuda = FakeCuda(monkeypatch)
    with memory.cuda_budget(CUDA, budget):
        pass
    assert cuda.fractions == [] and cuda.workspaces == 0


def test_a_budget_a_real_card_can_honour_caps_the_allocator_above_what_it_holds_and_is_lifted_after(monkeypatch):
    budget = 64 * MIB
    cuda = FakeCuda(monkeypatch, reserved=300 * MIB)
    with memory.cuda_budget(CUDA, budget):
        # on entry: cuBLAS's workspace taken first, then the cap set above what is reserved by then
        assert cuda.workspaces == 1
        assert cuda.fractions == [(300 * MIB + budget + 2 * MIB + 20 * MIB) / cuda.total]
    assert cuda.fractions[-1] == 1.0  # lifted: a later run in the process is not capped
    assert memory.cuda_budget(torch.device("cpu"), budget).__enter__() is None  # the CPU: nothing to cap


@pytest.mark.parametrize("callers", [0.5, 0.001])
def test_the_callers_memory_fraction_is_put_back_and_never_loosened(monkeypatch, callers):
    # 0.5 of 80 GiB is looser than the budget's cap (386 MiB): the cap holds inside; 0.001 (82 MB) is tighter: it
    # stays. Either way the caller's fraction is in force again after the block, on an error too.
    budget = 64 * MIB
    cuda = FakeCuda(monkeypatch, reserved=300 * MIB, fraction=callers)
    cap = (300 * MIB + budget + 2 * MIB + 20 * MIB) / cuda.total
    with memory.cuda_budget(CUDA, budget):
        assert cuda.fraction == min(cap, callers)
    assert cuda.fraction == callers
    with pytest.raises(memory.OutOfMemory):
        with memory.cuda_budget(CUDA, budget):
            raise torch.OutOfMemoryError("CUDA out of memory")
    assert cuda.fractions == [min(cap, callers), callers] * 2


def test_the_allocators_out_of_memory_becomes_accumlibs_naming_the_budget(monkeypatch):
    cuda = FakeCuda(monkeypatch, peak=70 * MIB)
    with pytest.raises(memory.OutOfMemory, match=r"needs 73,400,320 bytes .* budget is 67,108,864 bytes"):
        with memory.cuda_budget(CUDA, 64 * MIB):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
    assert cuda.fractions[-1] == 1.0  # lifted on the error too


def test_a_steps_peak_on_cuda_is_the_allocators_over_what_the_step_did_not_hold(monkeypatch):
    # The model's weights, gradients and optimizer state are the step's (counted, in 512-byte blocks); whatever else
    # was allocated before (the data set on the GPU, other models, cuBLAS's workspace) is not: the same bytes as
    # check_fits's trace of the step, which a budget is compared with.
    with FakeTensorMode():
        weight = torch.nn.Parameter(torch.empty(100, device="cuda"))  # 400 bytes: one 512-byte block
        weight.grad = torch.empty(100, device="cuda")
    model = torch.nn.Module()
    model.weight = weight
    optimizer = torch.optim.SGD([weight], lr=0.1)
    cuda = FakeCuda(monkeypatch, allocated=5 * MIB + 1024, peak=5 * MIB + 1024 + 3000)
    with memory.step_peak(model, optimizer, CUDA) as peak:
        pass
    assert cuda.workspaces == 1
    assert peak.bytes == 1024 + 3000  # weight and gradient (2 x 512) + what the step allocated on top
