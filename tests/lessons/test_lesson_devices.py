"""A lesson's one device (accumlib.lessons.devices): chosen once, said in the course language, and every lesson
function, dashboard, exercise checker and notebook puts its models, data and runs there. No GPU here: the meta
device stands in for one (below)."""

import pytest
import torch

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
    assert (
        devices.describe(torch.device("cuda"), page="dashboards")
        == "These dashboards run on the GPU: NVIDIA T4 (cuda)."
    )
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


def test_the_lessons_choice_is_the_library_s():
    # One choice, the library's: accumlib.devices.pick, which accumlib.train(device=None) makes, is what
    # lessons.devices re-exports, not a copy (tests/library/test_devices.py: train honours ACCUMLIB_DEVICE).
    from accumlib import devices as library_devices

    assert devices.pick is library_devices.pick


X, Y = data.digits(16, flat=True)


# --- The lessons' functions on the device the lesson chose (issue 20): each family run on a stand-in GPU. ---------
# The stand-in is the meta device (shapes, no values), as in tests/library/test_memory.py's
# test_the_measurements_move_the_data_to_the_models_device: in this CPU build FakeTensorMode's
# 'cuda' tensors refuse `.to('cuda')` and autograd (measured: "PyTorch is not linked with support for cuda devices",
# and an abort in backward), so a training run cannot go there, while on meta every forward, backward and optimizer
# step runs. A tensor left on the CPU meets the meta model or data and raises a device mismatch, as it would on
# CUDA; the run stops at its first host read (.item(), .tolist(): meta has no values), which is as far as a device
# test without a GPU goes. Each test below fails without the change that puts the function's models and data on
# `device` (checked by reverting it: a device mismatch, or forward passes on the CPU).
MISMATCH = (
    "Expected all tensors to be on the same device",
    "is not on the expected device",
    "different devices",
    "same device",
)
REFUSED = "model is on the meta device (weights without data)"  # measure_step's refusal, before any forward
STOPS = ("Cannot copy out of meta tensor", "cannot be called on meta tensors", REFUSED, "_local_scalar_dense")


def on_meta(monkeypatch, run):
    """run(meta) with train's refusal of the meta device lifted; return the devices every module's forward pass saw
    (its tensor inputs and its own parameters). A device mismatch fails the test; a host read ends the run."""
    from accumlib import batches, run_checks, source

    monkeypatch.setattr(
        run_checks, "_device", lambda device: torch.device(device) if device is not None else devices.pick()
    )
    monkeypatch.setattr(source, "_refuse_meta", lambda batch: None)
    monkeypatch.setattr(batches, "_refuse_meta", lambda batch: None)
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


@pytest.mark.parametrize(
    "check",
    [
        lambda: exercises.largest_batch.verdict(lambda fits: 64 if fits(64) else 1),
        lambda: exercises.memory_plan.verdict(8, 32),
        lambda: exercises.batchnorm_split.verdict(lambda fits, batch: (1, batch)),  # too small: measures the deviation
        lambda: exercises.time_cost.verdict(1),
    ],
    ids=["largest_batch", "memory_plan", "batchnorm_split", "time_cost"],
)
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
            pitfalls.classic_train(
                net,
                (X.to(device), Y.to(device)),
                torch.optim.SGD(net.parameters(), lr=0.5),
                micro_batch_size=4,
                accum_steps=2,
                clip_grad_norm=0.05,
                clip_per_micro_batch=per_micro_batch,
            )
            return net

        show.once_per_step.clipping(clipped, max_norm=0.05)

    assert on_meta(monkeypatch, run) == {torch.device("meta")}


CHOOSING = [
    "00_in_ten_minutes",
    "01_large_batch_problem",
    "02_grad_accumulates",
    "03_the_loop",
    "04_last_cycle",
    "05_memory",
    "06_time",
    "07_batchnorm",
    "08_once_per_step",
    "09_ddp",
    "10_recap_and_quiz",
    "dashboards",
]


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
    chosen = {"09_ddp": 'device = torch.device("cpu")', "dashboards": 'device = devices.choose(page="dashboards")'}.get(
        name, "device = devices.choose()"
    )
    assert chosen in code[0] and not any("device = " in cell for cell in code[1:])
    text = "\n".join(code)
    for call in re.findall(r"\btrain\((?:[^()]|\([^()]*\))*\)", text):  # accumlib.train, or train imported
        assert "device=device" in call, call
    for built in re.finditer(r"models\.\w+\((?:[^()]|\([^()]*\))*\)", text):
        assert text[built.end() :].startswith(".to(device)"), built.group()
    for loaded in re.finditer(r"data\.digits\(", text):
        assert text[: loaded.start()].endswith("(t.to(device) for t in ") or name == "09_ddp", text[loaded.start() :][
            :60
        ]
    # an exercise cell is the learner's: its checker gives it everything on its own device (fingerprint.py)
    assert not any('"cpu"' in cell.replace(chosen, "") for cell in code if "exercises." not in cell)
