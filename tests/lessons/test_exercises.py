"""Issue 11 section 3: every exercise's stub runs and gets a true verdict, its solution passes, and each bug it
diagnoses is named. The wrong loops come from pitfalls.classic_train's switches where it has one, so the two
modules check each other."""

import contextlib
import functools
import io
import linecache
import re
import textwrap

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import accumlib
from accumlib import i18n
from accumlib.lessons import data, exercises, models, pitfalls
from accumlib.lessons.exercises import planning

NAMESPACE = dict(torch=torch, nn=nn, exercises=exercises)


def run_cell(code: str) -> tuple[str, dict]:
    """Run a cell as a lesson would (torch, nn and exercises imported); return what it printed and its names."""
    names = dict(NAMESPACE)
    output = io.StringIO()
    code = textwrap.dedent(code)
    filename = f"<cell {hash(code)}>"  # the cell's source kept where inspect finds it, as Jupyter keeps it
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    with contextlib.redirect_stdout(output):
        exec(compile(code, filename, "exec"), names)
    return output.getvalue(), names


def verdict_of_cell(exercise, names: dict):
    """The verdict on the answer a cell defined (its function, or its variables)."""
    return exercise.verdict(*(names[name] for name in exercise.answer))


ALL = [exercise for group in exercises.BY_LESSON.values() for exercise in group]
STUB_FINDINGS = {
    "largest_batch": ["not-largest"],
    "scale_loss": ["missing-division"],
    "the_loop": ["step-every-micro-batch", "missing-division"],
    "last_cycle": ["tail-divided-by-steps"],
    "memory_plan": ["does-not-fit"],
    "time_cost": ["no-prediction"],
    "batchnorm_split": ["smaller-than-needed"],
    "amp_loop": ["scaler-unused"],
    "clip_after_unscale": ["clipped-scaled"],
    "no_sync": ["no-sync-missing"],
    "first_loop": ["your-turn"],
}


def test_every_lesson_but_the_recap_has_an_exercise():
    assert sorted(exercises.BY_LESSON) == list(range(0, 10))
    assert all(e.lesson == lesson for lesson, group in exercises.BY_LESSON.items() for e in group)
    assert sorted(STUB_FINDINGS) == sorted(e.name for e in ALL)


@pytest.mark.parametrize("exercise", ALL, ids=lambda e: e.name)
def test_the_stub_runs_as_stored_and_prints_its_true_verdict_the_same_way_twice(exercise):
    printed, names = run_cell(exercise.stub)
    again, _ = run_cell(exercise.stub)
    result = verdict_of_cell(exercise, names)
    assert not result.correct and result.names == STUB_FINDINGS[exercise.name], result.text
    assert printed == again == result.text + "\n"
    assert not re.search(r"0x[0-9a-f]{6,}|\d ?(s|ms|seconds)\b", printed)  # no addresses, no times


@pytest.mark.parametrize("exercise", ALL, ids=lambda e: e.name)
def test_the_solution_passes_and_solution_prints_its_code(exercise, capsys):
    printed, names = run_cell(exercise.solution_code)
    assert printed.startswith("Right! "), printed
    assert verdict_of_cell(exercise, names).correct
    exercise.solution()
    assert exercise.solution_code.rstrip() in capsys.readouterr().out
    exercise.hint()
    assert capsys.readouterr().out.startswith("Hint: ")


def test_every_line_of_a_verdict_comes_from_the_message_catalogue(monkeypatch):
    """With a catalogue that marks every message it translates, no line of a verdict is left unmarked."""

    class Marking(i18n.gettext.NullTranslations):
        def gettext(self, message):
            return "«" + message + "»"

        def ngettext(self, singular, plural, n):
            return "«" + (singular if n == 1 else plural) + "»"

    monkeypatch.setattr(i18n, "catalogue", lambda code: Marking())
    for exercise in ALL:
        _, names = run_cell(exercise.stub.replace(f"exercises.{exercise.name}.check", "print"))
        for line in verdict_of_cell(exercise, names).text.splitlines():
            assert line.removeprefix("- ").startswith("«") and line.endswith("»"), (exercise.name, line)


def defined(code: str, name: str):
    """The function `name` that a learner's cell defines."""
    return run_cell(code)[1][name]


# ---------------------------------------------------------------- loops (lessons 3, 4, 8, 9)


def classic(**switches):
    """A learner's loop that is pitfalls.classic_train with these switches, epoch by epoch on the loader's samples.

    The loader hands each epoch's micro-batches out first; classic_train, with the same seed, visits the same ones
    in the same order (the check recognises them by content).
    """

    def accumulate(model, optimizer, loader, loss_fn, accum_steps, epochs=1):
        problem = loader.problem
        for epoch in range(epochs):
            list(loader)
            pitfalls.classic_train(
                model,
                problem.data(epoch),
                optimizer,
                micro_batch_size=problem.micro_batch_size,
                accum_steps=accum_steps,
                seed=problem.seed,
                loss_fn=loss_fn,
                **switches,
            )

    return accumulate


def classic_amp(**switches):
    def accumulate(model, optimizer, scaler, loader, loss_fn, accum_steps):
        classic(scaler=scaler, **switches)(model, optimizer, loader, loss_fn, accum_steps)

    return accumulate


def solution_without_check(exercise) -> str:
    """The code of an exercise's solution cell, without its check() line: a right answer to break."""
    return exercise.solution_code.replace(f"exercises.{exercise.name}.check(", "print(")


LOOP = solution_without_check(exercises.the_loop)
OFF_BY_ONE = LOOP.replace("(step + 1) % accum_steps == 0", "step % accum_steps == 0")
NEVER_ZEROED = LOOP.replace("optimizer.zero_grad()", "pass")


@pytest.mark.parametrize(
    "loop, names",
    [
        (classic(), []),  # the classic recipe is right when the samples fill whole cycles
        (classic(divide=False), ["missing-division"]),
        (classic(zero_every_micro_batch=True), ["zeroed-inside"]),
        (classic(step_every_micro_batch=True), ["step-every-micro-batch"]),
        (classic(step_every_micro_batch=True, divide=False), ["step-every-micro-batch", "missing-division"]),
        (OFF_BY_ONE, ["off-by-one"]),
        (NEVER_ZEROED, ["never-zeroed"]),
        (LOOP.replace("optimizer.step()", "optimizer.zero_grad()\n            optimizer.step()"), ["empty-step"]),
        (LOOP.replace("loss.backward()", "pass"), ["empty-step"]),
        (LOOP.replace("(step + 1) % accum_steps == 0", "False"), ["no-step"]),
        (LOOP.replace("/ accum_steps", "/ (accum_steps + 1)"), ["wrong-weight"]),
        (LOOP.replace("(step + 1) % accum_steps == 0", "step % 2 == 1"), ["steps-misplaced", "not-stepped"]),
        (
            LOOP.replace("(step + 1) % accum_steps == 0", "(step + 1) % accum_steps == 0 and step < 6"),
            ["steps-misplaced", "not-stepped"],
        ),
        (
            LOOP.replace(
                "loss.backward()",
                "loss.backward()\n        if step % accum_steps == 0:\n            optimizer.zero_grad()",
            ),
            ["lost-gradients"],
        ),
        (
            LOOP.replace("/ accum_steps", "/ accum_steps + sum((p ** 2).sum() for p in model.parameters())"),
            ["not-micro-batch-gradients"],
        ),
        (LOOP.replace("loss.backward()", "loss.backward()\n        raise ValueError('my bug')"), ["error"]),
        (LOOP.replace("model(x)", "model(x * 2)"), ["unknown-input"]),
        (LOOP.replace("/ accum_steps", "/ accum_steps * (1 + optimizer.param_groups[0]['lr'])"), ["training-differs"]),
    ],
    ids=[
        "classic",
        "no-division",
        "zero-inside",
        "step-every",
        "stub",
        "off-by-one",
        "never-zeroed",
        "zero-before-step",
        "no-backward",
        "never-steps",
        "divided-by-4",
        "every-second",
        "two-cycles-of-three",
        "zero-after-first",
        "weight-decay-in-loss",
        "raises",
        "changes-inputs",
        "only-right-at-lr-0",
    ],
)
def test_the_loop_names_each_bug(loop, names):
    function = defined(loop, "accumulate") if isinstance(loop, str) else loop
    result = exercises.the_loop.verdict(function)
    assert result.names == names, result.text
    assert result.correct == (names == [])


def test_the_loop_says_where_and_by_how_much():
    text = exercises.the_loop.verdict(classic(divide=False)).text
    assert "counts 3 times its share, so step 1's gradient is 3 times too large" in text
    text = exercises.the_loop.verdict(defined(OFF_BY_ONE, "accumulate")).text
    assert "after 1 micro-batch instead of 3" in text and "the last 2 micro-batches never reach a step" in text
    text = exercises.the_loop.verdict(classic(zero_every_micro_batch=True)).text
    assert "at step 1 the gradients of the 2 micro-batches before it were wiped out" in text
    text = exercises.the_loop.verdict(defined(NEVER_ZEROED, "accumulate")).text
    assert "Step 2 still holds the gradients of 3 micro-batches that earlier steps already applied" in text
    text = exercises.the_loop.verdict(
        defined(LOOP.replace("optimizer.step()", "optimizer.zero_grad()\n            optimizer.step()"), "accumulate")
    ).text
    assert "zero_grad() runs after the last backward() and before optimizer.step()" in text
    text = exercises.the_loop.verdict(defined(LOOP.replace("loss.backward()", "pass"), "accumulate")).text
    assert "no backward() ran before it" in text


def test_the_loop_refuses_a_wrong_signature_and_a_value():
    result = exercises.the_loop.verdict(lambda model, optimizer, loader: None)
    assert result.names == ["signature"] and "(model, optimizer, loader, loss_fn, accum_steps)" in result.text
    assert exercises.the_loop.verdict(None).names == ["not-a-function"]


MEAN_OF_MEANS = """
def accumulate(model, optimizer, loader, loss_fn, accum_steps, epochs):
    for epoch in range(epochs):
        micro_batches = list(loader)
        for first in range(0, len(micro_batches), accum_steps):
            cycle = micro_batches[first:first + accum_steps]
            for x, y in cycle:
                (loss_fn(model(x), y) / len(cycle)).backward()
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize(
    "loop, names",
    [
        (classic(last_cycle="weighted"), []),
        (classic(last_cycle="drop"), ["tail-dropped"]),
        (classic(last_cycle="leak"), ["leaked-tail", "tail-dropped"]),
        (classic(last_cycle="divide-by-steps"), ["tail-divided-by-steps"]),
        (MEAN_OF_MEANS, ["tail-mean-of-means"]),
        (MEAN_OF_MEANS.replace("range(epochs)", "range(1)"), ["micro-batch-count"]),
    ],
    ids=["weighted", "drop", "leak", "divide-by-steps", "mean-of-means", "one-epoch"],
)
def test_last_cycle_names_each_bug(loop, names):
    function = defined(loop, "accumulate") if isinstance(loop, str) else loop
    result = exercises.last_cycle.verdict(function)
    assert result.names == names, result.text


def test_a_last_cycle_weighted_as_if_its_micro_batches_were_full_is_told_so():
    # the review: told that the micro-batches "count equally", where they count 0.5 and 0.167
    full = LAST.replace("samples = sum(len(y) for x, y in cycle)", "samples = len(cycle) * len(cycle[0][1])")
    result = exercises.last_cycle.verdict(defined(full, "accumulate"))
    assert result.names == ["tail-full-size"], result.text
    assert "as if each of its 2 micro-batches held 3 samples (6 in all), but they hold 3, 1 (4 in all)" in result.text
    assert "count 0.667 of a step" in result.text


def test_last_cycle_measures_what_the_tail_counts():
    text = exercises.last_cycle.verdict(classic(last_cycle="divide-by-steps")).text
    assert "only 2 micro-batches, yet each is still divided by accum_steps = 3: together they count 0.67" in text
    text = exercises.last_cycle.verdict(classic(last_cycle="drop")).text
    assert "epoch 1 is dropped: its 2 micro-batches (4 samples)" in text


AMP = solution_without_check(exercises.amp_loop)
AMP_DIRECT = AMP.replace("scaler.step(optimizer)", "optimizer.step()").replace("scaler.update()", "pass")


@pytest.mark.parametrize(
    "loop, names",
    [
        (classic_amp(), []),
        (classic_amp(unscale_per_micro_batch=True), ["unscale-per-micro-batch"]),
        (classic_amp(update_per_micro_batch=True), ["update-before-step"]),
        (classic_amp(unscale_per_micro_batch=True, update_per_micro_batch=True), ["update-per-micro-batch"]),
        (classic_amp(step_every_micro_batch=True), ["step-every-micro-batch"]),
        (classic_amp(divide=False), ["missing-division"]),
        (AMP_DIRECT, ["optimizer-step-direct"]),
        (AMP.replace("scaler.scale(loss).backward()", "loss.backward()"), ["loss-not-scaled"]),
        (
            AMP.replace(
                "scaler.scale(loss).backward()",
                "(scaler.scale(loss) if (step + 1) % accum_steps == 0 else loss).backward()",
            ),
            ["loss-not-scaled"],
        ),
        (AMP.replace("scaler.update()", "pass"), ["update-missing"]),
    ],
    ids=[
        "classic",
        "unscale-per-micro",
        "update-per-micro",
        "unscale-and-update-per-micro",
        "step-every",
        "no-division",
        "optimizer-step",
        "never-scaled",
        "scaled-at-the-step-only",
        "no-update",
    ],
)
def test_amp_loop_names_each_scaler_mistake(loop, names):
    function = defined(loop, "accumulate") if isinstance(loop, str) else loop
    result = exercises.amp_loop.verdict(function)
    assert result.names == names, result.text


def test_amp_loop_measures_the_silent_update_per_micro_batch():
    text = exercises.amp_loop.verdict(classic_amp(unscale_per_micro_batch=True, update_per_micro_batch=True)).text
    ratio = float(re.search(r"step 1's gradient is ([0-9.e+-]+) times the right one", text).group(1))
    assert 0 < ratio < 1 / 2**16 and "(12 times for 3 steps)" in text  # 9 per micro-batch + 3 after the steps


CLIP = solution_without_check(exercises.clip_after_unscale)


@pytest.mark.parametrize(
    "step, names",
    [
        (CLIP, []),
        (CLIP.replace("torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)", "pass"), ["not-clipped"]),
        (CLIP.replace("parameters(), max_norm)", "parameters(), max_norm / 2)"), ["clipped-wrong"]),
        (CLIP.replace("optimizer.zero_grad()", "pass"), ["never-zeroed"]),
        (CLIP.replace("scaler.step(optimizer)", "optimizer.step()"), ["optimizer-step-direct"]),
        (CLIP.replace("scaler.update()", "pass"), ["update-missing"]),
        # the review's wrong diagnoses: a direct optimizer.step() (PyTorch then stops scaler.update()) was told to move
        # scaler.update(); clipping after the step was told it never clipped
        (
            "def optimizer_step(model, optimizer, scaler, max_norm):\n"
            "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n    optimizer.step()\n    "
            "scaler.update()\n"
            "    optimizer.zero_grad()\n",
            ["optimizer-step-direct"],
        ),
        (
            CLIP.replace(
                "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # clip the true gradient\n"
                "    scaler.step(optimizer)  # knows the gradient is unscaled already\n",
                "    scaler.step(optimizer)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n",
            ),
            ["not-clipped"],
        ),
    ],
    ids=[
        "right",
        "no-clip",
        "clip-half",
        "no-zero",
        "optimizer-step",
        "no-update",
        "direct-step-then-update",
        "clip-after-step",
    ],
)
def test_clip_after_unscale_names_each_mistake(step, names):
    result = exercises.clip_after_unscale.verdict(defined(step, "optimizer_step"))
    assert result.names == names, result.text


def test_clip_after_step_is_told_to_clip_before_the_step():
    step = CLIP.replace(
        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # clip the true gradient\n"
        "    scaler.step(optimizer)  # knows the gradient is unscaled already\n",
        "    scaler.step(optimizer)\n    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)\n",
    )
    text = exercises.clip_after_unscale.verdict(defined(step, "optimizer_step")).text
    assert "before the step" in text and "Between scaler.unscale_(optimizer) and scaler.step(optimizer)" in text


@pytest.mark.parametrize(
    "loop, names",
    [
        # the review's wrong diagnoses of amp_loop: both were told to "multiply each micro-batch's loss by its share"
        (
            AMP.replace(
                "            scaler.step(optimizer)  #",
                "            torch.nn.utils.clip_grad_norm_(model.parameters(), "
                "0.5)\n            scaler.step(optimizer)  #",
            ),
            ["gradient-rescaled"],
        ),
        (
            AMP.replace("scaler.scale(loss).backward()", "scaler.scale(loss)\n        loss.backward()"),
            ["scale-not-backpropagated"],
        ),
        (
            AMP.replace(
                "        if (step + 1) % accum_steps == 0:  # once per step:\n"
                "            scaler.step(optimizer)  # unscale, check for inf/NaN, step\n",
                "        scaler.step(optimizer)\n        if (step + 1) % accum_steps == 0:  # once per step:\n",
            ),
            ["step-every-micro-batch"],
        ),
        # valid: an evaluation under no_grad after each step
        (
            AMP.replace(
                "            optimizer.zero_grad()",
                "            optimizer.zero_grad()\n            with torch.no_grad():\n                model(x)",
            ),
            [],
        ),
    ],
    ids=["clip-while-scaled", "backward-on-the-unscaled-loss", "scaler-step-every-micro-batch", "evaluates"],
)
def test_amp_loop_names_what_the_gradient_shows_not_a_loss_weight(loop, names):
    result = exercises.amp_loop.verdict(defined(loop, "accumulate"))
    assert result.names == names, result.text
    if names == ["gradient-rescaled"]:
        assert "65536 times too far" in result.text


def test_clipping_the_scaled_gradient_leaves_it_scale_times_too_small():
    function = defined(
        exercises.clip_after_unscale.stub.replace("exercises.clip_after_unscale.check", "print"), "optimizer_step"
    )
    text = exercises.clip_after_unscale.verdict(function).text
    assert f"unscaled it to norm {0.7 / 2**16:.2e}, 65536 times too small" in text


ALWAYS_RESCALED = CLIP.replace(
    "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # clip the true gradient\n",
    "    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])\n"
    "    for p in model.parameters():\n        p.grad.mul_(max_norm / norm)  # always\n",
)


def test_a_clip_that_scales_every_gradient_to_max_norm_is_told_so_on_the_first_problem():
    # the review: caught only on the second problem, and told "not numbers copied from the first problem"
    result = exercises.clip_after_unscale.verdict(defined(ALWAYS_RESCALED, "optimizer_step"))
    assert result.names == ["clipped-up"], result.text
    assert "step 3" in result.text and "already below max_norm = 0.7" in result.text


@pytest.mark.parametrize(
    "max_norm, cause",
    [("1.0", "65536 times too far"), ("5.0", "65536 times too far"), ("0.3", "to a norm the task did not ask for")],
)
def test_amp_loop_tells_a_clip_before_unscale_from_one_after_it(max_norm, cause):
    # the review: a clip to 1.0 before unscale_ was told "after scaler.unscale_(), to a norm the task did not ask for"
    where = "" if cause.startswith("65536") else "            scaler.unscale_(optimizer)\n"
    loop = AMP.replace(
        "            scaler.step(optimizer)  #",
        where + "            torch.nn.utils.clip_grad_norm_("
        f"model.parameters(), {max_norm})\n            scaler.step(optimizer)  #",
    )
    result = exercises.amp_loop.verdict(defined(loop, "accumulate"))
    assert result.names == ["gradient-rescaled"] and cause in result.text, result.text


def test_a_loss_cut_off_from_the_model_is_not_told_that_no_backward_ran():
    detached = LOOP.replace(
        "loss_fn(model(x), y) / accum_steps", "loss_fn(model(x), y).detach().requires_grad_() / accum_steps"
    )
    result = exercises.the_loop.verdict(defined(detached, "accumulate"))
    assert result.names == ["empty-step"] and "backward() ran, but on a loss cut off from the model" in result.text
    no_backward = exercises.the_loop.verdict(defined(LOOP.replace("loss.backward()", "pass"), "accumulate"))
    assert no_backward.names == ["empty-step"] and "no backward() ran before it" in no_backward.text


@pytest.mark.parametrize("language", ["en", "hi"])
def test_a_loop_that_takes_too_few_micro_batches_is_told_in_words_that_fit_one_epoch(language):
    # the lessons review (1.4): lesson 0's `pass` was told "... took 0 micro-batches from the loader, but 1 passes
    # over it give 16"; over several epochs the message counts the passes (lesson 4's problems)
    body_pass = cell(f"def accumulate({LOOP_ARGS}):\n    pass\n", "accumulate")
    one = cell(FIRST.replace("optimizer.zero_grad()\n", "optimizer.zero_grad()\n        break\n"), "accumulate")
    accumlib.set_language(language)
    try:
        verdicts = [exercises.first_loop.verdict(answer) for answer in (body_pass, one)]
    finally:
        accumlib.set_language("en")
    assert [v.names for v in verdicts] == [["micro-batch-count"]] * 2, [v.text for v in verdicts]
    expected = {
        "en": ["took 0 micro-batches from the loader, but one pass over it gives 16", "took 1 micro-batch from the"],
        "hi": ["पर loader को एक बार पूरा पढ़ने पर 16 micro-batches", "loader से 1 micro-batch लिया"],
    }[language]
    for verdict, words in zip(verdicts, expected, strict=True):
        assert words in verdict.text and "1 passes" not in verdict.text and "1 बार" not in verdict.text, verdict.text


MANUAL_UPDATE = "with torch.no_grad():\n    for p in model.parameters():\n        p -= 0.01 * p.grad\n"
DECAY = "with torch.no_grad():\n    for p in model.parameters():\n        p.mul_(0.9)  # a weight decay of its own\n"


@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("after each step", "before optimizer step 2"),
        ("after the loop", "after the last optimizer step"),
    ],
)
@pytest.mark.parametrize("exercise", ["first_loop", "the_loop"])
def test_an_update_of_the_weights_of_its_own_is_named_as_such(exercise, where, words):
    # the lessons review (1.4): an extra manual update was told "The gradient at step 2 is not made of the
    # micro-batches' gradients" (the weights it changed made the next gradients different)
    loop = FIRST if exercise == "first_loop" else LOOP
    if where == "after each step":
        loop = loop.replace("optimizer.step()\n", "optimizer.step()\n" + textwrap.indent(MANUAL_UPDATE, " " * 12))
    else:
        loop = loop.replace("\n\n\nprint(", "\n" + textwrap.indent(DECAY, " " * 4) + "\n\nprint(")
    verdict = getattr(exercises, exercise).verdict(cell(loop, "accumulate"))
    assert verdict.names == ["weights-changed"], verdict.text
    assert words in verdict.text and "only optimizer.step() may change them" in verdict.text, verdict.text


def test_an_input_in_another_dtype_is_explained_from_the_dtypes():
    # torch 2.13 says "mat1 and mat2 must have the same dtype"; the check reads the dtypes, not the message
    result = exercises.the_loop.verdict(defined(LOOP.replace("model(x)", "model(x.float())"), "accumulate"))
    assert result.names == ["dtype-mismatch"], result.text
    assert "Model call 1 got x in float32, but the check's model is in float64" in result.text
    assert exercises.the_loop.verdict(defined(LOOP.replace("model(x)", "model(x.double())"), "accumulate")).correct


def test_amp_loop_names_a_grad_scaler_of_its_own():
    # the review: told "The GradScaler is never used"
    own = AMP.replace(
        "    for step, (x, y)", "    scaler = torch.amp.GradScaler('cpu')  # its own\n    for step, (x, y)"
    )
    result = exercises.amp_loop.verdict(defined(own, "accumulate"))
    assert result.names == ["own-scaler"], result.text


CUDA_AUTOCAST = AMP.replace("with torch.autocast(x.device.type, dtype=torch.float16):", "with cuda_autocast():")


@contextlib.contextmanager
def cuda_autocast():
    """What torch.autocast("cuda", dtype=torch.float16) sets where torch has CUDA (in this CPU build it would
    disable itself): CUDA's autocast flag and dtype, which leave operations on the CPU alone."""
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.float16)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", False)


@pytest.mark.parametrize("device, names", [("cuda", []), ("cpu", ["no-autocast"])])
def test_amp_loop_accepts_cuda_autocast_where_the_lesson_runs_on_cuda(monkeypatch, device, names):
    from accumlib import devices as library_devices

    monkeypatch.setattr(library_devices, "pick", lambda environ=None: torch.device(device))
    loop = defined(CUDA_AUTOCAST, "accumulate")
    loop.__globals__["cuda_autocast"] = cuda_autocast
    result = exercises.amp_loop.verdict(loop)
    assert result.names == names, result.text


NO_SYNC = solution_without_check(exercises.no_sync)
FORWARD_OUTSIDE = NO_SYNC.replace("        with contextlib", "        out = model(x)\n        with contextlib").replace(
    "loss_fn(model(x), y)", "loss_fn(out, y)"
)
SYNC_FIRST = """
import contextlib

def accumulate(model, optimizer, loader, loss_fn, accum_steps):
    for step, (x, y) in enumerate(loader):
        with contextlib.nullcontext() if step % accum_steps == 0 else model.no_sync():
            (loss_fn(model(x), y) / accum_steps).backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


@pytest.mark.parametrize(
    "loop, names",
    [
        (FORWARD_OUTSIDE, ["no-sync-forward-outside"]),
        (SYNC_FIRST, ["no-allreduce-before-step", "allreduce-too-early"]),
        (
            SYNC_FIRST.replace("contextlib.nullcontext() if step % accum_steps == 0 else ", ""),
            ["no-allreduce-before-step"],
        ),
        (
            SYNC_FIRST.replace("step % accum_steps == 0", "(step + 1) % accum_steps == 0").replace(
                " / accum_steps", ""
            ),
            ["missing-division"],
        ),
    ],
    ids=["forward-outside", "sync-first", "never-sync", "no-division"],
)
def test_no_sync_names_where_ddp_all_reduces_and_cleans_up_its_process_group(loop, names):
    result = exercises.no_sync.verdict(defined(loop, "accumulate"))
    assert result.names == names, result.text
    assert not dist.is_initialized()


def test_no_sync_runs_inside_a_jupyter_kernel_twice_and_leaves_no_process_group():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [
        "import torch\nfrom torch import nn\nfrom accumlib.lessons import exercises",
        exercises.no_sync.stub,
        exercises.no_sync.solution_code,
        exercises.no_sync.solution_code,
        "import torch.distributed as dist\nprint(dist.is_initialized())",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    printed = ["".join(o.get("text", "") for o in cell.outputs) for cell in notebook.cells]
    assert printed[1].startswith("Not yet: 1 problem.\n- DDP all-reduces the gradients after every micro-batch")
    assert printed[2].startswith("Right! One all-reduce per optimizer step (3 for 3 steps)")
    assert printed[3] == printed[2] and printed[4] == "False\n"


# ---------------------------------------------------------------- lesson 2: scaling the loss


@pytest.mark.parametrize(
    "body, name",
    [
        ("return loss / accum_steps ** 2", "wrong-scale"),
        ("return loss.item() / accum_steps", "not-a-tensor"),
        ("return loss.detach() / accum_steps", "detached"),
        ("return loss * (1 + torch.rand(()))", "not-proportional"),
        ("return loss / undefined_name", "error"),
    ],
    ids=["squared", "item", "detach", "random", "raises"],
)
def test_scale_loss_names_each_mistake(body, name):
    function = defined(f"def scale_loss(loss, accum_steps):\n    {body}\n", "scale_loss")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        assert exercises.scale_loss.verdict(function).names == [name]


def test_scale_loss_measures_the_factor():
    text = exercises.scale_loss.verdict(lambda loss, accum_steps: loss / accum_steps**2).text
    assert "add up to 0.25 times the full-batch gradient" in text


# ---------------------------------------------------------------- lessons 1 and 5: memory


def test_largest_batch_is_the_largest_that_fits_and_one_more_does_not():
    exercise = exercises.largest_batch
    best = exercise.largest()
    assert planning.step_peak(best) <= exercise.card_bytes < planning.step_peak(best + 1)
    assert exercise.verdict(lambda fits: fits(1) and best + 1).names == ["too-large"]
    low = exercise.verdict(lambda fits: fits(3) and best - 3)
    assert low.names == ["not-largest"] and "powers of two" not in low.text
    assert exercise.verdict(lambda fits: fits(0)).names == ["error"]
    assert exercise.verdict(lambda fits: "70").names == ["not-a-batch"]


def test_a_plan_the_check_refuses_is_refused_by_train_with_the_same_budget():
    model = models.cnn()
    with pytest.raises(accumlib.OutOfMemory) as refused:
        accumlib.train(
            model,
            data.digits(256),
            torch.optim.SGD(model.parameters(), lr=0.05),
            micro_batch_size=16,
            accum_steps=16,
            memory_budget=exercises.memory_plan.card_bytes,
            measure_memory=False,
        )
    assert refused.value.needed_bytes == planning.step_peak(16, 16)
    result = exercises.memory_plan.verdict(16, 16)
    assert result.names == ["does-not-fit"] and f"needs {planning.step_peak(16, 16):,} bytes" in result.text


def test_the_peak_of_an_accumulating_step_is_the_same_from_two_micro_batches_on():
    for micro in (8, 16):
        peaks = {planning._measured_peak(micro, k, torch.device("cpu")) for k in (2, 3, 5)}
        assert len(peaks) == 1 and planning._measured_peak(micro, 1, torch.device("cpu")) < peaks.pop()


@pytest.mark.parametrize(
    "plan, name",
    [
        ((8, 16), "wrong-effective-batch"),
        ((8.5, 30), "not-a-count"),
        (("8", 32), "not-a-count"),
        ((8, 0), "not-a-count"),
    ],
)
def test_memory_plan_names_each_mistake(plan, name):
    assert exercises.memory_plan.verdict(*plan).names == [name]


# ---------------------------------------------------------------- prediction (lesson 6)


def test_the_prediction_is_compared_with_the_measurement():
    assert exercises.time_cost.verdict(16).names == ["prediction-off"]
    assert exercises.time_cost.verdict("one").names == ["not-a-number"]
    one, many = exercises.time_cost.count(64, 1), exercises.time_cost.count(4, 16)
    assert one[0] == many[0] and many[1] > 5 * one[1]  # the same arithmetic, many more operator calls


# ---------------------------------------------------------------- lesson 7: the largest micro-batch that fits


@pytest.mark.parametrize(
    "body, name",
    [
        ("return 8, 8", "wrong-product"),  # hard-coded: right for 64 on 0.5 MiB only, and the checker asks for several
        ("return 8, effective_batch // 8", "smaller-than-needed"),  # a fixed size: 16 fits 96 on 1 MiB
        ("return effective_batch, 1", "does-not-fit"),
        (
            "m = 1\n    while fits(m * 2) and effective_batch % (m * 2) == 0:\n        m *= 2\n"
            "    return m, effective_batch // m",
            "smaller-than-needed",
        ),  # powers of two only: 10 fits and divides 60, 4 is returned
        ("return fits(0)", "error"),  # fits() refuses sizes outside 1 .. effective_batch, in words
        ("return [1, 2, 3]", "not-a-pair"),
        ("return 'eight', 8", "not-a-pair"),
        ("while True:\n        fits(1)", "endless-search"),  # stopped by the call limit (a core.Budget)
        ("raise KeyError('m')", "error"),
    ],
    ids=["hard-coded", "fixed-size", "too-large", "powers-of-two", "bad-size", "three", "text", "endless", "raises"],
)
def test_batchnorm_split_names_each_mistake(body, name):
    function = defined(f"def choose_split(fits, effective_batch):\n    {body}\n", "choose_split")
    result = exercises.batchnorm_split.verdict(function)
    assert result.names == [name], result.text
    assert "Traceback" not in result.text


@pytest.mark.parametrize(
    "body",
    [
        "for m in range(effective_batch, 0, -1):\n        if effective_batch % m == 0 and fits(m):\n"
        "            return float(m), effective_batch / m",  # floats with whole values
        "best = max(m for m in range(1, effective_batch + 1) if effective_batch % m == 0 and fits(m))\n"
        "    return torch.tensor(best), effective_batch // best",  # a 0-d tensor
    ],
    ids=["floats", "tensor"],
)
def test_batchnorm_split_accepts_unusual_valid_answers(body):
    function = defined(f"def choose_split(fits, effective_batch):\n    {body}\n", "choose_split")
    assert exercises.batchnorm_split.verdict(function).correct


def test_batchnorm_split_stops_a_loop_that_never_calls_fits(short_time_limits):
    # the limit itself, not its length, is under test: the time limit every exercise shares (core.Exercise)
    function = defined("def choose_split(fits, effective_batch):\n    while True:\n        pass\n", "choose_split")
    result = exercises.batchnorm_split.verdict(function)
    assert result.names == ["time-limit"] and f"{SHORT_LIMIT:g} seconds" in result.text


# ---------------------------------------------------------------- issue 21: answers that try to fool or crash a check
# For every exercise: a hard-coded (or copied) answer, a crashing one, one that never terminates and an unusual valid
# one, each with the verdict it must get. test_the_verdict_table prints the whole table (pytest -s shows it).


class Endless(float):
    """A number whose value never comes: float() of it loops forever (a non-terminating answer to a number task)."""

    def __float__(self):
        while True:
            pass


class Broken(float):
    """A number whose value raises."""

    def __float__(self):
        raise RuntimeError("my number is broken")


def cell(code: str, name: str):
    return defined(textwrap.dedent(code), name)


FOREVER = "    while True:\n        pass\n"
LOOP_ARGS = "model, optimizer, loader, loss_fn, accum_steps"
HARD_CODED_LOOP = LOOP.replace("/ accum_steps", "/ 3").replace("% accum_steps", "% 3")
SEED_PATTERN = LOOP.replace(
    "        loss = loss_fn",
    "        if step % accum_steps == 0:\n            optimizer.zero_grad()"
    "  # the seed's pattern: zero at the start of a cycle\n        loss = loss_fn",
).replace("            optimizer.zero_grad()  # once per cycle, after the step\n", "")
LAST = solution_without_check(exercises.last_cycle)
FIRST = solution_without_check(exercises.first_loop)
AMP_BF16 = AMP.replace("torch.float16", "torch.bfloat16")

# The step condition, in every form a verdict or hint could state it (lesson 0 asks for it as its quick check)
STEP_CONDITION = re.compile(r"%\s*accum_steps|\(step \+ 1\)|accum_steps - 1\b")


@pytest.mark.parametrize("language", ["en", "hi"])
def test_lesson_zero_never_states_the_step_condition_before_the_learner_writes_one(language):
    """Lesson 0's quick check is the condition itself, and learners see the stub's stored verdict: the stub gets a
    prompt, a loop that steps after every micro-batch is told so without the condition, and the hint (on request)
    leads to it without stating it. After a wrong condition of the learner's own (the off-by-one), it may be said."""
    accumlib.set_language(language)
    try:
        _, names = run_cell(exercises.first_loop.stub.replace("exercises.first_loop.check", "print"))
        stub = exercises.first_loop.verdict(names["accumulate"])
        always = exercises.first_loop.verdict(
            cell(FIRST.replace("(step + 1) % accum_steps == 0", "True"), "accumulate")
        )
        hint = io.StringIO()
        with contextlib.redirect_stdout(hint):
            exercises.first_loop.hint()
    finally:
        accumlib.set_language("en")
    assert stub.names == ["your-turn"] and always.names == ["step-every-micro-batch"]
    assert "exercises.first_loop.hint()" in stub.text and "16" in always.text and "4" in always.text
    for text in (stub.text, always.text, hint.getvalue()):
        assert not STEP_CONDITION.search(text), text
    # lesson 3's own check of the same loop still names the condition: only lesson 0 keeps it back
    assert STEP_CONDITION.search(
        exercises.the_loop.verdict(cell(LOOP.replace("(step + 1) % accum_steps == 0", "True"), "accumulate")).text
    )


# exercise -> case -> (the answer: a tuple of the values check() gets, the finding names it must get; [] is right)
CASES = {
    "largest_batch": {
        "hard-coded": ((lambda fits: 70,), ["hard-coded"]),  # the right size for the lesson's card, no search
        "crashing": ((lambda fits: fits(0),), ["error"]),
        "non-terminating": (
            (
                cell(
                    "def largest_batch(fits):\n    batch = 1\n    while fits(batch * 2):\n"
                    "        batch * 2  # typo: never kept\n    return batch\n",
                    "largest_batch",
                ),
            ),
            ["endless-search"],
        ),
        "non-terminating, no fits()": (
            (cell("def largest_batch(fits):\n" + FOREVER, "largest_batch"),),
            ["time-limit"],
        ),
        "unusual valid": (
            (
                cell(
                    "def largest_batch(fits):\n    batch = 1.0\n    while fits(batch + 1):\n"
                    "        batch += 1.0  # a linear search in floats\n    return batch\n",
                    "largest_batch",
                ),
            ),
            [],
        ),
    },
    "scale_loss": {
        "hard-coded": ((lambda loss, accum_steps: loss / 4,), ["not-general"]),
        "crashing": ((lambda loss, accum_steps: (loss.backward(), loss / accum_steps)[1],), ["backward-inside"]),
        "crashing, None .grad": (
            (lambda loss, accum_steps: torch.ones((), requires_grad=True) * loss.item(),),
            ["no-gradient"],
        ),
        "non-terminating": ((cell("def scale_loss(loss, accum_steps):\n" + FOREVER, "scale_loss"),), ["time-limit"]),
        "unusual valid": ((lambda loss, accum_steps: loss.div(float(accum_steps)),), []),
    },
    "the_loop": {
        "hard-coded": ((cell(HARD_CODED_LOOP, "accumulate"),), ["not-general"]),
        "crashing": (
            (cell(LOOP.replace("loss.backward()", "loss.backward()\n        loss.backward()"), "accumulate"),),
            ["backward-twice"],
        ),
        "frozen model": (
            (cell(LOOP.replace("    for step", "    model.requires_grad_(False)\n    for step"), "accumulate"),),
            ["model-frozen"],
        ),
        "non-terminating": ((cell(f"def accumulate({LOOP_ARGS}):\n" + FOREVER, "accumulate"),), ["time-limit"]),
        "unusual valid": ((cell(SEED_PATTERN, "accumulate"),), []),
    },
    "last_cycle": {
        "hard-coded": (
            (cell(LAST.replace("accum_steps)", "3)").replace("first + accum_steps", "first + 3"), "accumulate"),),
            ["not-general"],
        ),
        "crashing": (
            (cell(LAST.replace("samples = sum", "samples = sum(y for x, y in cycle) + sum"), "accumulate"),),
            ["error"],
        ),
        "non-terminating": ((cell(f"def accumulate({LOOP_ARGS}, epochs):\n" + FOREVER, "accumulate"),), ["time-limit"]),
        "unusual valid": ((cell(LAST.replace("* len(y) / samples", "/ samples * y.numel()"), "accumulate"),), []),
    },
    "memory_plan": {
        "hard-coded": ((8, 32), []),  # copied from the solution: a plan is a pair of numbers, so it passes
        "crashing": ((Broken(8.0), 32), ["check-failed"]),
        "non-terminating": ((Endless(8.0), 32), ["time-limit"]),
        "unusual valid": ((4, 256 / 4), []),  # fits, not the fastest; 64.0 is a float
    },
    "time_cost": {
        "hard-coded": ((1,), []),  # a prediction is a number: the right one passes
        "crashing": ((Broken(1.0),), ["check-failed"]),
        "non-terminating": ((Endless(1.0),), ["time-limit"]),
        "unusual valid": ((np.float32(1.0),), []),
    },
    "amp_loop": {
        "hard-coded": (
            (cell(AMP.replace("/ accum_steps", "/ 3").replace("% accum_steps", "% 3"), "accumulate"),),
            ["not-general"],
        ),
        "no autocast": (
            (
                cell(
                    AMP.replace(
                        "with torch.autocast(x.device.type, dtype=torch.float16):  # on the device x is on", "if True:"
                    ),
                    "accumulate",
                ),
            ),
            ["no-autocast"],
        ),
        "crashing": (
            (cell(AMP.replace("scaler.update()  # adapt", "scaler.update(0)  # adapt"), "accumulate"),),
            ["error"],
        ),
        "non-terminating": (
            (
                cell(
                    "def accumulate(model, optimizer, scaler, loader, loss_fn, accum_steps):\n" + FOREVER, "accumulate"
                ),
            ),
            ["time-limit"],
        ),
        "unusual valid": ((cell(AMP_BF16, "accumulate"),), []),
    },
    "clip_after_unscale": {
        "hard-coded": (
            (cell(CLIP.replace("parameters(), max_norm)", "parameters(), 0.7)"), "optimizer_step"),),
            ["not-general"],
        ),
        "crashing": (
            (
                cell(
                    CLIP.replace(
                        "    scaler.unscale_(optimizer)", "    optimizer.zero_grad()\n    scaler.unscale_(optimizer)"
                    ),
                    "optimizer_step",
                ),
            ),
            ["zeroed-before-step"],
        ),
        "non-terminating": (
            (cell("def optimizer_step(model, optimizer, scaler, max_norm):\n" + FOREVER, "optimizer_step"),),
            ["time-limit"],
        ),
        "unusual valid": (
            (
                cell(
                    CLIP.replace(
                        "    scaler.unscale_(optimizer)  # the true gradient, once per step\n"
                        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)",
                        "    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm * scaler.get_scale())",
                    ),
                    "optimizer_step",
                ),
            ),
            [],
        ),
    },
    "no_sync": {
        "hard-coded": (
            (cell(NO_SYNC.replace("% accum_steps", "% 3").replace("/ accum_steps", "/ 3"), "accumulate"),),
            ["not-general"],
        ),
        "crashing": ((cell(NO_SYNC.replace("model.no_sync()", "model.no_sync"), "accumulate"),), ["error"]),
        "non-terminating": ((cell(f"def accumulate({LOOP_ARGS}):\n" + FOREVER, "accumulate"),), ["time-limit"]),
        "unusual valid": (
            (
                cell(
                    NO_SYNC.replace(
                        "contextlib.nullcontext() if last else model.no_sync()",
                        "model.no_sync() if not last else contextlib.nullcontext()",
                    ),
                    "accumulate",
                ),
            ),
            [],
        ),
    },
    "batchnorm_split": {
        # right for 64 on the first card only: the checker asks for other effective batches too
        "hard-coded": ((lambda fits, effective_batch: (8, 8),), ["wrong-product"]),
        "crashing": ((lambda fits, effective_batch: (fits(effective_batch + 1), 1),), ["error"]),
        "non-terminating": (
            (cell("def choose_split(fits, effective_batch):\n" + FOREVER, "choose_split"),),
            ["time-limit"],
        ),
        "unusual valid": (
            (
                cell(
                    "def choose_split(fits, effective_batch):\n"
                    "    sizes = [m for m in range(1, effective_batch + 1) if effective_batch % m == 0]\n"
                    "    m = max(filter(fits, sizes))  # the largest divisor that fits\n"
                    "    return m, effective_batch / m  # a float with a whole value\n",
                    "choose_split",
                ),
            ),
            [],
        ),
    },
    "first_loop": {
        # the lesson's 4 written in: right on the first problem (accum_steps = 4), not on the second (3)
        "hard-coded": (
            (cell(FIRST.replace("% accum_steps", "% 4").replace("/ accum_steps", "/ 4"), "accumulate"),),
            ["not-general"],
        ),
        "crashing": (
            (cell(FIRST.replace("loss.backward()", "loss.backward()\n        loss.backward()"), "accumulate"),),
            ["backward-twice"],
        ),
        "non-terminating": ((cell(f"def accumulate({LOOP_ARGS}):\n" + FOREVER, "accumulate"),), ["time-limit"]),
        "unusual valid": (
            (
                cell(
                    FIRST.replace("(step + 1) % accum_steps == 0", "step % accum_steps == accum_steps - 1"),
                    "accumulate",
                ),
            ),
            [],
        ),
    },
}
SHORT_LIMIT = 0.5  # seconds: the time limit for the answers that never end (see verdict_of)


@functools.lru_cache(maxsize=None)
def verdict_of(name: str, case: str):
    """The verdict on CASES[name][case], once per test session. Only an answer that never ends runs under a time
    limit cut to SHORT_LIMIT, so that its test ends quickly: the tests assert verdicts, never durations, and every
    other answer keeps the default limit (15 s of the learner's code, about 100 times what a right answer's code
    takes here)."""
    exercise = getattr(exercises, name)
    answer, names = CASES[name][case]
    limit = exercise.time_limit
    exercise.time_limit = SHORT_LIMIT if "time-limit" in names else limit
    try:
        return exercise.verdict(*answer)
    finally:
        exercise.time_limit = limit


@pytest.fixture
def short_time_limits(monkeypatch):
    """Each check's time limit cut to SHORT_LIMIT, for tests whose answers never end."""
    for exercise in ALL:
        monkeypatch.setattr(exercise, "time_limit", SHORT_LIMIT)


@pytest.mark.parametrize(
    "name, case",
    [(n, c) for n, cases in CASES.items() for c in cases],
    ids=[f"{n}:{c}" for n, cases in CASES.items() for c in cases],
)
def test_an_answer_that_tries_to_fool_or_crash_the_check_gets_its_verdict(name, case):
    import sys

    names = CASES[name][case][1]
    hook = sys.excepthook
    result = verdict_of(name, case)
    assert result.names == names and result.correct == (names == []), result.text
    assert "Traceback" not in result.text and sys.excepthook is hook and not dist.is_initialized()
    if "time-limit" in names:
        assert f"{SHORT_LIMIT:g} seconds" in result.text


def test_every_exercise_meets_all_four_kinds_of_answer_and_the_table_of_verdicts():
    """Every exercise has the four cases; the table of their verdicts (pytest -s prints it) is what the test above
    asserts, case by case."""
    for name in (e.name for e in ALL):
        assert {"hard-coded", "crashing", "non-terminating", "unusual valid"} <= set(CASES[name]), name
    print("\nexercise x case -> verdict")
    for name, cases in CASES.items():
        for case, (_answer, names) in cases.items():
            result = verdict_of(name, case)
            shown = "right" if result.correct else ", ".join(result.names)
            assert shown == (", ".join(names) or "right"), (name, case, result.text)
            print(f"{name:20} {case:28} -> {shown}")


def test_the_time_limit_lives_only_during_a_check(short_time_limits):
    import signal
    import threading

    before = signal.getsignal(signal.SIGALRM), threading.active_count()
    function = cell(f"def accumulate({LOOP_ARGS}):\n" + FOREVER, "accumulate")
    assert exercises.the_loop.verdict(function).names == ["time-limit"]
    assert (signal.getsignal(signal.SIGALRM), threading.active_count()) == before
    # in a thread other than the main one the limit still stops the code (an asynchronous exception)
    out = []
    worker = threading.Thread(target=lambda: out.append(exercises.the_loop.verdict(function)))
    worker.start()
    worker.join()
    assert out[0].names == ["time-limit"]


@pytest.mark.parametrize(
    "value, whole",
    [
        (32, 32),
        (32.0, 32),
        (np.float32(32.0), 32),
        (np.int64(32), 32),
        (torch.tensor(32), 32),
        (torch.tensor(32.0), 32),
        (32.5, None),
        (True, None),
        ("32", None),
        (float("nan"), None),
        (torch.ones(2), None),
    ],
)
def test_whole_numbers_of_any_real_numeric_type(value, whole):
    from accumlib.lessons.exercises.core import whole_number

    assert whole_number(value) == whole


def test_a_plan_that_fits_passes_and_names_the_fastest_one():
    for plan in ((4, 64), (1, 256), (np.int64(8), np.float32(32.0))):
        result = exercises.memory_plan.verdict(*plan)
        assert result.correct, result.text
    assert "8 x 32" in exercises.memory_plan.verdict(4, 64).text


def _tokens_without_comments(code: str) -> list[tuple[int, str]]:
    import io
    import tokenize

    return [
        (t.type, t.string) for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type != tokenize.COMMENT
    ]


def test_every_solution_prints_its_comments_in_the_course_language_and_its_code_unchanged(capsys):
    """Hindi review S-1: `solution()` printed about 30 English comments in Hindi mode. Now each comment is looked up
    in the catalogue (msgctxt: the exercise's class), the code around it is the same token for token, and English
    mode prints solution_code as written."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    import hindi

    import accumlib

    for group in exercises.BY_LESSON.values():
        for exercise in group:
            exercise.solution()
            english = capsys.readouterr().out
            assert english.split("\n", 1)[1].rstrip() == exercise.solution_code.rstrip(), exercise.name
            try:
                accumlib.set_language("hi")
                exercise.solution()
                shown = capsys.readouterr().out.split("\n", 1)[1]
            finally:
                accumlib.set_language("en")
            assert _tokens_without_comments(shown) == _tokens_without_comments(exercise.solution_code.rstrip() + "\n")
            comments = [
                line.split("#", 1)[1] for line in shown.splitlines() if "  # " in line or line.lstrip().startswith("#")
            ]
            assert comments, exercise.name
            for comment in comments:
                assert hindi.devanagari_share(comment) > 0 and not hindi.untranslated(comment), (exercise.name, comment)
