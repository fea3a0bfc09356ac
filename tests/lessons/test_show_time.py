"""accumlib.lessons.show.time (lesson 6): measured times differ from run to run, so everything printed must read the
same after notebooks/sanitize.cfg masks the times (what nbval compares); the one sentence whose wording depends on
the times is checked on both of its branches."""

import dataclasses
import re
from pathlib import Path

import pytest
from nbval.plugin import get_sanitize_patterns

from accumlib import timing
from accumlib.lessons import data, models
from accumlib.lessons.show import time as show

X, Y = data.digits(64)
SANITIZE = Path(__file__).resolve().parents[2] / "notebooks" / "sanitize.cfg"


def masked(text: str) -> str:
    """`text` as nbval compares it: every regex of notebooks/sanitize.cfg applied."""
    for regex, replace in get_sanitize_patterns(SANITIZE.read_text(encoding="utf-8")):  # nbval's own parser
        text = re.sub(regex, replace, text)
    return text


def quick(model):
    return timing.decompose_time(model, (X, Y), accum_steps=(1, 4, 16), repeats=1, warmup=0)


def printed(capsys, small, wider) -> str:
    show.steps(small)
    show.passes(small)
    show.compare({"cnn()": small, "cnn(channels=(32, 64))": wider})
    return capsys.readouterr().out


def test_two_runs_print_the_same_once_times_are_masked(capsys):
    small, wider = quick(models.cnn()), quick(models.cnn(channels=(32, 64)))
    first = printed(capsys, small, wider)
    # the same measurements with every time scaled: other digits, other widths, the same masked text
    slower = [
        dataclasses.replace(
            d,
            overhead_seconds=d.overhead_seconds * 13.7,
            seconds_per_sample=d.seconds_per_sample * 13.7,
            optimizer_seconds=d.optimizer_seconds * 13.7,
            passes=tuple(
                dataclasses.replace(p, seconds=p.seconds * 13.7, fitted_seconds=p.fitted_seconds * 13.7)
                for p in d.passes
            ),
            steps=tuple(
                dataclasses.replace(
                    s,
                    seconds=s.seconds * 13.7,
                    predicted_seconds=s.predicted_seconds * 13.7,
                    overhead_seconds=s.overhead_seconds * 13.7,
                    compute_seconds=s.compute_seconds * 13.7,
                )
                for s in d.steps
            ),
        )
        for d in (small, wider)
    ]
    second = printed(capsys, *slower)
    assert first != second and masked(first) == masked(second)
    assert re.search(r"\d\.\d+ ms", first) and "T ms" in masked(first) and "R.RRx" in masked(first)
    assert not re.search(r"\d\.\d", masked(first)), "a measured number escapes the masks"
    assert not re.search(r"\d%", masked(first)), "a measured share escapes the masks"


def test_steps_and_passes_say_what_grows_with_accum_steps(capsys):
    small = quick(models.cnn())
    ratios = show.steps(small)
    assert ratios[0] == 1 and len(ratios) == 3
    plot = show.passes(small)
    out = capsys.readouterr().out
    assert "4 × 16 takes" in out and "What grows is the fixed cost, paid once per pass" in out
    assert plot.figure.axes[0].get_ylim()[0] == 0
    assert plot.figure.axes[0].get_title().startswith("One pass costs ")


def decomposition(overhead: float, per_sample: float) -> timing.TimeDecomposition:
    """A decomposition whose measurements lie exactly on the line overhead + per_sample * size (seconds)."""
    sizes, batch = (64, 16, 4), 64
    passes = tuple(timing.PassTiming(m, overhead + per_sample * m, overhead + per_sample * m, ()) for m in sizes)
    steps = tuple(
        timing.StepTiming(
            batch // m,
            m,
            (batch // m) * (overhead + per_sample * m),
            (batch // m) * (overhead + per_sample * m),
            (batch // m) * overhead,
            per_sample * batch,
            (),
        )
        for m in sizes
    )
    return timing.TimeDecomposition(
        "cpu",
        timing.THREAD_CPU,
        1,
        batch,
        overhead,
        per_sample,
        0.0,
        tuple(sorted(passes, key=lambda p: p.micro_batch_size)),
        steps,
    )


def test_compare_says_the_fixed_cost_is_a_smaller_part_only_when_it_is(capsys):
    small = decomposition(1e-3, 1e-4)
    ratios = show.compare({"small": small, "wider": decomposition(1e-3, 1e-3)})
    assert ratios["wider"][-1] < ratios["small"][-1]
    # a pass grows 13x from 4 to 64 samples on the wider line (1 ms + 1 ms/sample), 5.29x on the small one
    assert (
        "From 4 to 64 samples a pass of wider takes 13.00x the time, one of small 5.29x: more of its time is "
        "arithmetic per sample"
    ) in capsys.readouterr().out
    show.compare({"small": small, "heavier calls": decomposition(1e-2, 1e-4)})
    assert "a pass of heavier calls takes 1.58x the time, one of small 5.29x: here either" in capsys.readouterr().out


def test_compare_refuses_decompositions_of_different_splits():
    with pytest.raises(ValueError, match="decompositions must split the same effective batch the same ways"):
        show.compare(
            {"a": decomposition(1e-3, 1e-4), "b": dataclasses.replace(decomposition(1e-3, 1e-4), effective_batch=32)}
        )
    with pytest.raises(ValueError, match="two or more models"):
        show.compare({"a": decomposition(1e-3, 1e-4)})


def test_cost_tells_slightly_from_several_times_and_says_which_part_of_a_pass_dominates(capsys):
    """Lesson 0's sweep, on exact lines: 1 ms + 0.1 ms per sample makes 16 × 4 1.41x and 4 × 16 3.03x the time of
    64 × 1, a pass of 4 mostly fixed cost (71%), the whole batch's mostly arithmetic (14%): the sentence compares
    those two, far apart (a size between them, nearer one half, would tell another machine otherwise)."""
    ratios = show.cost(decomposition(1e-3, 1e-4))
    out = capsys.readouterr().out
    assert ratios[1] == pytest.approx(10.4 / 7.4) and ratios[2] == pytest.approx(22.4 / 7.4)
    assert (
        "Against 64 × 1 (7.40 ms), 16 × 4 takes only slightly longer (1.41x), 4 × 16 several times as long (3.03x)."
    ) in out
    assert "mostly fixed cost at 4 samples, mostly arithmetic at 64. Small micro-batches underuse" in out
    show.cost(decomposition(2e-3, 1e-4))  # 16 × 4: 14.4 against 8.4 ms, between the two verdicts
    out = capsys.readouterr().out  # a pass of 16 is mostly fixed cost (56%), but the sentence is of 4 and 64
    assert "16 × 4 takes 1.71x as long" in out and "mostly fixed cost at 4 samples, mostly arithmetic at 64" in out
    show.cost(decomposition(8e-3, 1e-4))  # the whole batch's pass mostly fixed cost too (56%)
    assert "mostly fixed cost at 4 and at 64 samples" in capsys.readouterr().out
    show.cost(decomposition(1e-4, 1e-3))  # arithmetic everywhere: splitting costs little
    assert "mostly arithmetic at 4 and at 64 samples, so the fixed cost adds little" in capsys.readouterr().out


def test_cost_prints_the_same_once_times_are_masked_and_refuses_a_sweep_it_cannot_read(capsys):
    show.cost(decomposition(1e-3, 1e-4))
    first = capsys.readouterr().out
    show.cost(decomposition(1.37e-3, 1.37e-4))  # every time 1.37 times as long: other digits, the same findings
    second = capsys.readouterr().out
    assert first != second and masked(first) == masked(second)
    assert not re.search(r"\d\.\d", masked(first)), "a measured number escapes the masks"
    with pytest.raises(ValueError, match="two or more splits"):
        show.cost(dataclasses.replace(decomposition(1e-3, 1e-4), steps=decomposition(1e-3, 1e-4).steps[:2]))


def test_steps_name_the_clock_of_the_device_they_ran_on(capsys):
    """Lesson 6 says the table names its clock: the thread's CPU time on one CPU thread, wall time on a GPU."""
    show.steps(decomposition(1e-3, 1e-4))
    out = capsys.readouterr().out
    assert "Measured on cpu, 1 thread(s); the clock: the CPU time of the one thread that computes" in out
    show.steps(dataclasses.replace(decomposition(1e-3, 1e-4), device="cuda:0", clock=timing.WALL))
    assert (
        "Measured on cuda:0, 1 thread(s); the clock: wall time (on a GPU: after waiting for the card"
        in capsys.readouterr().out
    )
