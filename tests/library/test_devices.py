"""One device for a lesson (accumlib.lessons.devices), and the library's measurements moving their data to the
model's device. No GPU here: FakeTensorMode accepts `cuda` tensors in this CPU build of torch, computes nothing,
and raises FakeTensorDeviceMismatchError where an operation mixes devices, so a device mix-up is caught on the CPU.
Autograd on a fake CUDA tensor aborts a CPU build, so only forward passes are checked this way."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorDeviceMismatchError, FakeTensorMode

import accumlib
from accumlib import batchnorm
from accumlib.lessons import data, devices, exercises
from accumlib.lessons.exercises import normalization, planning
from accumlib.lessons.quiz import experiments as quiz_experiments


def test_the_gpu_when_there_is_one_else_the_cpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.choose({}) == torch.device("cpu")
    assert capsys.readouterr().out == "This lesson runs on the CPU.\n"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA T4")
    assert devices.choose({}) == torch.device("cuda")
    assert capsys.readouterr().out == "This lesson runs on the GPU: NVIDIA T4 (cuda).\n"
    # the test suite's setting: the CPU even where there is a GPU, so the stored outputs are the CPU's
    assert devices.choose({"ACCUMLIB_DEVICE": "cpu"}) == torch.device("cpu")


def test_the_dashboards_page_says_its_dashboards_run_there_in_either_language(monkeypatch, capsys):
    from accumlib import i18n
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.choose({}, page="dashboards") == torch.device("cpu")
    assert capsys.readouterr().out == "These dashboards run on the CPU.\n"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA T4")
    assert (devices.describe(torch.device("cuda"), page="dashboards")
            == "These dashboards run on the GPU: NVIDIA T4 (cuda).")
    before = i18n.language()
    try:
        i18n.set_language("hi")
        assert devices.describe(torch.device("cpu"), page="dashboards") != "These dashboards run on the CPU."
        assert devices.describe(torch.device("cpu"), page="dashboards") != devices.describe(torch.device("cpu"))
    finally:
        i18n.set_language(before)
    # a page it has no sentence for: refused, naming it and what is valid, before anything is printed
    with pytest.raises(ValueError, match="page='notebook': valid: 'lesson', 'dashboards'"):
        devices.choose({}, page="notebook")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("asked, message", [("cuda", "ACCUMLIB_DEVICE='cuda' but this machine has no CUDA GPU"),
                                            ("cuda:3", "no CUDA GPU"), ("tpu", "ACCUMLIB_DEVICE='tpu'"),
                                            ("gpu please", "is not a device; valid: cpu, cuda, cuda:N, mps")])
def test_an_unusable_choice_is_refused_with_its_name(monkeypatch, asked, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        devices.pick({"ACCUMLIB_DEVICE": asked})


X, Y = data.digits(16, flat=True)


def fake_cuda_model(mode):
    """A small BatchNorm model whose weights and buffers are fake tensors on cuda:0 (values never computed)."""
    net = torch.nn.Sequential(torch.nn.Linear(64, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                              torch.nn.Linear(16, 10))
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
@pytest.mark.parametrize("measure", [
    lambda net: batchnorm.micro_batch_deviation(net, X, 4),
    lambda net: batchnorm.running_stats_error(net, X),
    lambda net: batchnorm.evaluate(net, X, Y),
], ids=["micro_batch_deviation", "running_stats_error", "evaluate"])  # reestimate reads a value before its forward
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
        accumlib.gradient_gap(net, torch.nn.functional.cross_entropy, X, Y, 2)
    assert len(seen) == 3 and set(seen) == {torch.device("meta")}  # the full batch and both micro-batches


def test_train_without_a_device_honours_ACCUMLIB_DEVICE_as_the_lessons_do(monkeypatch):
    # One choice, the library's: accumlib.devices.pick is what lessons.devices re-exports, not a copy.
    from accumlib import devices as library_devices
    assert devices.pick is library_devices.pick
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


# --- The lessons' functions on the device the lesson chose (issue 20): each family run on a stand-in GPU. ---------
# The stand-in is the meta device (shapes, no values), as in test_recipe.py: in this CPU build FakeTensorMode's
# 'cuda' tensors refuse `.to('cuda')` and autograd (measured: "PyTorch is not linked with support for cuda devices",
# and an abort in backward), so a training run cannot go there, while on meta every forward, backward and optimizer
# step runs. A tensor left on the CPU meets the meta model or data and raises a device mismatch, as it would on
# CUDA; the run stops at its first host read (.item(), .tolist(): meta has no values), which is as far as a device
# test without a GPU goes. Each test below fails without the change that puts the function's models and data on
# `device` (checked by reverting it: a device mismatch, or forward passes on the CPU).
MISMATCH = ("Expected all tensors to be on the same device", "is not on the expected device", "different devices",
            "same device")
REFUSED = "model is on the meta device (weights without data)"  # measure_step's refusal, before any forward
STOPS = ("Cannot copy out of meta tensor", "cannot be called on meta tensors", REFUSED, "_local_scalar_dense")


def on_meta(monkeypatch, run):
    """run(meta) with train's refusal of the meta device lifted; return the devices every module's forward pass saw
    (its tensor inputs and its own parameters). A device mismatch fails the test; a host read ends the run."""
    from accumlib import loop, source
    monkeypatch.setattr(loop, "_device", lambda device: torch.device(device) if device is not None
                        else devices.pick())
    monkeypatch.setattr(source, "_refuse_meta", lambda batch: None)
    seen = []

    def hook(module, args):
        seen.extend(t.device for t in args if isinstance(t, torch.Tensor))
        seen.extend(p.device for p in module.parameters(recurse=False))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)
    text = ""
    try:
        run(torch.device("meta"))
    except Exception as error:  # noqa: BLE001 - a host read stops the run; a device mismatch fails the test
        text = f"{type(error).__name__}: {error} | cause: {error.__cause__!r}"
        assert not any(m in text for m in MISMATCH), text
        assert any(stop in text for stop in STOPS), text
    finally:
        handle.remove()
    # measure_step refuses a real measurement of a meta model before its forward: the model did reach `device`
    assert seen or REFUSED in text, "no forward pass ran"
    return set(seen) or {torch.device("meta")}


@pytest.mark.parametrize("name", sorted(quiz_experiments.RUNS))
def test_each_quiz_experiment_runs_on_the_device_given(monkeypatch, name):
    experiment = quiz_experiments.RUNS[name][0]
    assert on_meta(monkeypatch, experiment) == {torch.device("meta")}


class _Job:  # what a dashboard's compute() calls between steps; here never stale
    def check(self):
        pass


@pytest.mark.parametrize("dashboard", ["LossDashboard", "MemoryDashboard", "BatchNormDashboard"])
def test_each_dashboard_computes_on_the_device_given(monkeypatch, dashboard):
    from accumlib.lessons import widgets

    def run(device):
        board = getattr(widgets, dashboard)(device=device)  # the BatchNorm dashboard trains its CNN here
        board.compute(board.current_settings(), _Job())

    assert on_meta(monkeypatch, run) == {torch.device("meta")}


@pytest.mark.parametrize("check", [
    lambda: exercises.largest_batch.verdict(lambda fits: 64 if fits(64) else 1),
    lambda: exercises.memory_plan.verdict(8, 32),
    lambda: exercises.batchnorm_split.verdict(lambda fits, batch: (1, batch)),  # too small: measures the deviation
    lambda: exercises.time_cost.verdict(1),
], ids=["largest_batch", "memory_plan", "batchnorm_split", "time_cost"])
def test_each_exercise_checker_builds_its_models_and_data_on_the_lessons_device(monkeypatch, check):
    # The lesson's device is accumlib.devices.pick()'s: made the meta stand-in here. A checker answers in words
    # whatever escapes (a verdict, never an exception), so the devices its forward passes saw are what is checked.
    from accumlib import devices as library_devices
    for module in (planning, normalization):  # peaks measured before on the CPU are cached
        (getattr(module, "_measured_peak", None) or module.step_peak).cache_clear()
    monkeypatch.setattr(library_devices, "pick", lambda environ=None: torch.device("meta"))
    assert on_meta(monkeypatch, lambda device: check()) == {torch.device("meta")}


def test_the_show_helpers_keep_what_they_record_on_the_models_device(monkeypatch):
    from accumlib.lessons import pitfalls, show

    def run(device):
        # step_gradients: an optimizer whose parameters have no gradient records zeros, on their device
        model, idle = torch.nn.Linear(64, 10).to(device), torch.nn.Linear(10, 10).to(device)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, idle)]
        with show.once_per_step.step_gradients() as seen:
            torch.nn.functional.cross_entropy(model(X[:4].to(device)), Y[:4].to(device)).backward()
            for optimizer in optimizers:
                optimizer.step()
        torch.cat(seen)  # one device: what a comparison of the two steps' gradients needs
        # the classic loop of lessons 3, 4 and 8 on data and a model on the device, through a show helper

        def clipped(per_micro_batch):
            net = torch.nn.Linear(64, 10).to(device)
            pitfalls.classic_train(net, (X.to(device), Y.to(device)), torch.optim.SGD(net.parameters(), lr=0.5),
                                   micro_batch_size=4, accum_steps=2, clip_grad_norm=0.05,
                                   clip_per_micro_batch=per_micro_batch)
            return net

        show.once_per_step.clipping(clipped, max_norm=0.05)

    assert on_meta(monkeypatch, run) == {torch.device("meta")}


def test_bf16_is_offered_where_the_device_has_it(monkeypatch):
    from accumlib import devices as library_devices
    assert library_devices.supports_bf16(torch.device("cpu"))
    for supported in (True, False):  # a T4 (compute capability 7.5) has no bf16, an A100 or H100 has
        asked = []
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, s=supported, asked=asked:
                            asked.append(including_emulation) or s)
        assert library_devices.supports_bf16(torch.device("cuda")) is supported
        assert asked == [False]  # native kernels, not an emulation
    assert not library_devices.supports_bf16(torch.device("mps"))


CHOOSING = ["00_in_ten_minutes", "01_large_batch_problem", "02_grad_accumulates", "03_the_loop", "04_last_cycle",
            "05_memory", "06_time", "07_batchnorm", "08_once_per_step", "09_ddp", "10_recap_and_quiz", "dashboards"]


@pytest.mark.parametrize("name", CHOOSING)
def test_a_lesson_chooses_its_device_once_and_puts_every_model_batch_and_run_there(name):
    # Read from the English notebook's code (the Hindi one has the same code, tests/course/test_editions.py): the first
    # code cell after the platform set-up chooses the device; no other cell names one; every model built, every
    # digits batch loaded and every accumlib.train call goes to it. Lesson 9's DDP processes are CPU processes
    # (gloo), so its one device is the CPU, said in the cell.
    import re

    import nbformat
    from pathlib import Path
    notebook = nbformat.read(Path(__file__).resolve().parents[2] / "notebooks" / "en" / f"{name}.ipynb", 4)
    code = [c.source for c in notebook.cells if c.cell_type == "code" and c.get("id") != "platform-setup"]
    chosen = {"09_ddp": 'device = torch.device("cpu")',
              "dashboards": 'device = devices.choose(page="dashboards")'}.get(name, "device = devices.choose()")
    assert chosen in code[0] and not any("device = " in cell for cell in code[1:])
    text = "\n".join(code)
    for call in re.findall(r"\btrain\((?:[^()]|\([^()]*\))*\)", text):  # accumlib.train, or train imported
        assert "device=device" in call, call
    for built in re.finditer(r"models\.\w+\((?:[^()]|\([^()]*\))*\)", text):
        assert text[built.end():].startswith(".to(device)"), built.group()
    for loaded in re.finditer(r"data\.digits\(", text):
        assert text[:loaded.start()].endswith("(t.to(device) for t in ") or name == "09_ddp", text[loaded.start():][:60]
    # an exercise cell is the learner's: its checker gives it everything on its own device (fingerprint.py)
    assert not any('"cpu"' in cell.replace(chosen, "") for cell in code if "exercises." not in cell)


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_memory_budget_traces_a_cpu_model_on_the_device_it_trains_on_and_a_refusal_leaves_it_there(monkeypatch):
    # train(device="cuda") on a model still on the CPU: memory_budget's check must trace the step as CUDA runs it
    # (each block as the allocator rounds it), not with the CPU's bytes, and a refusal must leave the model on the
    # CPU, untouched. Autograd on a fake CUDA tensor aborts a CPU build, so the trace stops at memory._measure: a
    # spy records where the traced copy and its micro-batches are, and answers with a peak over the budget.
    import dataclasses

    from accumlib import loop, memory
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
                              torch.nn.Linear(64, 64))
    net[3].weight = net[0].weight  # a shared weight stays one parameter in the copy (the optimizer's mapping)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    state = {name: t.clone() for name, t in net.state_dict().items()}
    storages = [p.data_ptr() for p in net.parameters()]
    report = memory.check_fits(net, opt, X[:4], Y[:4], accum_steps=2, budget_bytes=2**30)  # on the CPU, for real
    seen = []

    def spy(model, optimizer, batches, *args, **kwargs):
        seen.append(({t.device.type for t in [*model.parameters(), *model.buffers()]},
                     {t.device.type for batch in batches for t in batch}, len(list(model.parameters())),
                     {id(p) for group in optimizer.param_groups for p in group["params"]} == {
                         id(p) for p in model.parameters()}))
        return dataclasses.replace(report, peak=2**40)

    monkeypatch.setattr(memory, "_measure", spy)
    monkeypatch.setattr(loop, "_device", torch.device)  # a machine with a GPU (this CPU build cannot hold one)
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
    from accumlib import cycle, devices as library_devices, loop
    net = torch.nn.Linear(64, 10)
    opt = torch.optim.Adam(net.parameters())
    state = {name: t.clone() for name, t in net.state_dict().items()}
    seen, asked = [], []
    net.register_forward_pre_hook(lambda module, args: seen.append(args[0].device))
    monkeypatch.setattr(loop, "_device", torch.device)
    monkeypatch.setattr(library_devices, "supports_bf16", lambda d: asked.append(d) or False)  # a T4
    with pytest.raises(ValueError, match=r"amp='bf16' but the GPU cuda has no native bfloat16 .*; valid here: "
                                         r"amp='fp16', which trains with a GradScaler, or amp=False"):
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
