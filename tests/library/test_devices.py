"""accumlib.devices (the device train chooses, bf16 where the device has it), and the library's measurements moving
their data to the model's device (a lesson's device, accumlib.lessons.devices: tests/lessons/test_lesson_devices.py).
No GPU here: FakeTensorMode accepts `cuda` tensors in this CPU build of torch, computes nothing, and raises
FakeTensorDeviceMismatchError where an operation mixes devices, so a device mix-up is caught on the CPU. Autograd on
a fake CUDA tensor aborts a CPU build, so only forward passes are checked this way."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError, FakeTensorMode

import accumlib
from accumlib import batchnorm, devices
from builders import data


@pytest.mark.parametrize(
    "asked, message",
    [
        ("cuda", "ACCUMLIB_DEVICE='cuda' but this machine has no CUDA GPU"),
        ("cuda:3", "no CUDA GPU"),
        ("tpu", "ACCUMLIB_DEVICE='tpu'"),
        ("gpu please", "is not a device; valid: cpu, cuda, cuda:N, mps"),
    ],
)
def test_an_unusable_choice_is_refused_with_its_name(monkeypatch, asked, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        devices.pick({"ACCUMLIB_DEVICE": asked})


X, Y = data.digits(16, flat=True)


def fake_cuda_model(mode):
    """A small BatchNorm model whose weights and buffers are fake tensors on cuda:0 (values never computed)."""
    net = torch.nn.Sequential(
        torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 10)
    )
    with mode:
        for module in net.modules():
            for name, p in list(module._parameters.items()):
                # no gradient: autograd on a fake CUDA tensor aborts a CPU build (its device guard)
                module._parameters[name] = torch.nn.Parameter(torch.empty(p.shape, device="cuda:0"), False)
            for name, b in list(module._buffers.items()):
                if b is not None:
                    module._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cuda:0")
    return net


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")  # a deepcopy of the fake model
@pytest.mark.parametrize(
    "measure",
    [
        lambda net: batchnorm.micro_batch_deviation(net, X, 4),
        lambda net: batchnorm.running_stats_error(net, X),
        lambda net: batchnorm.evaluate(net, X, Y),
    ],
    ids=["micro_batch_deviation", "running_stats_error", "evaluate"],
)  # reestimate reads a value before its forward
def test_batchnorm_measurements_run_where_the_model_is_given_data_on_the_cpu(measure):
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    net = fake_cuda_model(mode)
    seen = []
    net[1].register_forward_pre_hook(lambda module, args: seen.append(args[0].device))
    with mode:
        with pytest.raises(FakeTensorDeviceMismatchError):
            net(X)  # the mix-up this test would catch: CPU data into a CUDA model
        seen.clear()
        try:
            measure(net)
        except FakeTensorDeviceMismatchError:
            raise
        except Exception:  # noqa: BLE001 - a fake tensor has no value: the first host read (.item()) stops here
            pass
    assert seen and set(seen) == {torch.device("cuda:0")}  # every forward pass ran on the model's device


def test_gradient_gap_computes_where_the_model_is_given_data_on_the_cpu():
    # Autograd on a fake CUDA tensor aborts a CPU build; the meta device (shapes, no values) stands in for the GPU:
    # mixing it with CPU data raises as CUDA would, and the value read at the end is where meta must stop.
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 10)).to("meta")
    with pytest.raises(RuntimeError, match="not on the expected device"):
        net(X)  # the mix-up this test would catch
    seen = []
    net[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].device))
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):  # the final host read
        accumlib.gradient_gap(net, X, Y, accum_steps=2, loss_fn=torch.nn.functional.cross_entropy)
    assert len(seen) == 3 and set(seen) == {torch.device("meta")}  # the full batch and both micro-batches


def test_train_without_a_device_honours_ACCUMLIB_DEVICE_as_the_lessons_do(monkeypatch):
    net = torch.nn.Linear(64, 10)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    seen = []
    net.register_forward_pre_hook(lambda module, args: seen.append(args[0].device))
    # A machine "with a GPU": before this change train(device=None) chose CUDA here whatever ACCUMLIB_DEVICE said.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("ACCUMLIB_DEVICE", "cpu")
    accumlib.train(net, (X, Y), opt, accum_steps=2, micro_batch_size=4, max_steps=1)
    assert seen and set(seen) == {torch.device("cpu")}
    # unset: CUDA where there is one (this CPU build then fails moving the model there: it did choose CUDA)
    monkeypatch.delenv("ACCUMLIB_DEVICE")
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        accumlib.train(net, (X, Y), opt, accum_steps=2, micro_batch_size=4, max_steps=1)
    # asked for a device this machine lacks: refused by name, not replaced by another
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ACCUMLIB_DEVICE", "cuda:1")
    with pytest.raises(ValueError, match="ACCUMLIB_DEVICE='cuda:1' but this machine has no CUDA GPU"):
        accumlib.train(net, (X, Y), opt, accum_steps=2, micro_batch_size=4, max_steps=1)
    monkeypatch.delenv("ACCUMLIB_DEVICE")
    seen.clear()
    accumlib.train(net, (X, Y), opt, accum_steps=2, micro_batch_size=4, max_steps=1)
    assert set(seen) == {torch.device("cpu")}


def test_bf16_is_offered_where_the_device_has_it(monkeypatch):
    from accumlib import devices as library_devices

    assert library_devices.supports_bf16(torch.device("cpu"))
    for supported in (True, False):  # a T4 (compute capability 7.5) has no bf16, an A100 or H100 has
        asked = []
        monkeypatch.setattr(
            torch.cuda,
            "is_bf16_supported",
            lambda including_emulation=True, s=supported, asked=asked: asked.append(including_emulation) or s,
        )
        assert library_devices.supports_bf16(torch.device("cuda")) is supported
        assert asked == [False]  # native kernels, not an emulation
    assert not library_devices.supports_bf16(torch.device("mps"))


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_memory_budget_traces_a_cpu_model_on_the_device_it_trains_on_and_a_refusal_leaves_it_there(monkeypatch):
    # train(device="cuda") on a model still on the CPU: memory_budget's check must trace the step as CUDA runs it
    # (each block as the allocator rounds it), not with the CPU's bytes, and a refusal must leave the model on the
    # CPU, untouched. Autograd on a fake CUDA tensor aborts a CPU build, so the trace stops at tracing._measure: a
    # spy records where the traced copy and its micro-batches are, and answers with a peak over the budget.
    import dataclasses

    from accumlib import memory, run_checks, tracing

    net = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(), torch.nn.Linear(64, 64)
    )
    net[3].weight = net[0].weight  # a shared weight stays one parameter in the copy (the optimizer's mapping)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    state = {name: t.clone() for name, t in net.state_dict().items()}
    storages = [p.data_ptr() for p in net.parameters()]
    # on the CPU, for real
    report = memory.check_fits(net, X[:4], Y[:4], optimizer=opt, accum_steps=2, memory_budget=2**30)
    seen = []

    def spy(model, optimizer, batches, *args, **kwargs):
        seen.append(
            (
                {t.device.type for t in [*model.parameters(), *model.buffers()]},
                {t.device.type for batch in batches for t in batch},
                len(list(model.parameters())),
                {id(p) for group in optimizer.param_groups for p in group["params"]}
                == {id(p) for p in model.parameters()},
            )
        )
        return dataclasses.replace(report, peak=2**40)

    monkeypatch.setattr(tracing, "_measure", spy)
    monkeypatch.setattr(run_checks, "_device", torch.device)  # a machine with a GPU (this CPU build cannot hold one)
    with pytest.raises(memory.OutOfMemory, match="the budget is 1,048,576 bytes"):
        accumlib.train(net, (X, Y), opt, accum_steps=2, micro_batch_size=4, device="cuda", memory_budget=2**20)
    assert seen == [({"cuda"}, {"cuda"}, len(list(net.parameters())), True)]  # traced where it would train
    assert {p.device.type for p in [*net.parameters(), *net.buffers()]} == {"cpu"}  # refused: not moved
    assert [p.data_ptr() for p in net.parameters()] == storages and not opt.state
    assert all(torch.equal(state[name], t) for name, t in net.state_dict().items())


def test_amp_bf16_on_a_gpu_without_native_bf16_is_refused_before_anything_runs(monkeypatch):
    # A T4 (compute capability 7.5) only emulates bf16: train(amp="bf16") there is refused by name, with what is
    # valid, before any forward pass, weight or optimizer state changes. The GPU is a stand-in: this CPU build has
    # none, so train's device check and supports_bf16 are patched; the refusal is all that runs.
    from accumlib import cycle, devices as library_devices, run_checks

    net = torch.nn.Linear(64, 10)
    opt = torch.optim.Adam(net.parameters())
    state = {name: t.clone() for name, t in net.state_dict().items()}
    seen, asked = [], []
    net.register_forward_pre_hook(lambda module, args: seen.append(args[0].device))
    monkeypatch.setattr(run_checks, "_device", torch.device)
    monkeypatch.setattr(library_devices, "supports_bf16", lambda d: asked.append(d) or False)  # a T4
    with pytest.raises(
        ValueError,
        match=r"amp='bf16' but the GPU cuda has no native bfloat16 .*; valid here: "
        r"amp='fp16', which trains with a GradScaler, or amp=False",
    ):
        accumlib.train(net, (X, Y), opt, accum_steps=2, micro_batch_size=4, amp="bf16", device="cuda")
    assert asked == [torch.device("cuda")] and not seen and not opt.state
    assert all(torch.equal(state[name], t) for name, t in net.state_dict().items())
    # fp16 (and amp=True, fp16 on CUDA) on that GPU, and bf16 on the CPU, are not asked about: no refusal there
    cuda = torch.device("cuda")
    assert cycle._check_amp("fp16", cuda) is cycle._check_amp(True, cuda) is torch.float16
    assert cycle._check_amp("bf16", torch.device("cpu")) is torch.bfloat16 and len(asked) == 1
    # a GPU with native bf16 (an A100): accepted
    monkeypatch.setattr(library_devices, "supports_bf16", lambda d: asked.append(d) or True)
    assert cycle._check_amp("bf16", torch.device("cuda:1")) is torch.bfloat16 and asked[-1] == torch.device("cuda:1")
