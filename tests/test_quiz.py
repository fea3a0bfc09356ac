"""The quiz: schema-valid bilingual data, grading rules, and the widget driven from pytest."""
import json
import re
from importlib import resources

import jsonschema
import pytest

from accumlib import quiz

DEVANAGARI = re.compile(r"[\u0900-\u097F]")
TOPICS = {"grad-adds-up", "step", "loss-scaling", "zero-grad", "effective-batch", "memory", "time", "batchnorm",
          "last-cycle", "once-per-step", "ddp"}


def texts(node):
    """Every {en, hi} pair in the bank."""
    if isinstance(node, dict):
        if set(node) == {"en", "hi"}:
            yield node
        else:
            for value in node.values():
                yield from texts(value)
    elif isinstance(node, list):
        for value in node:
            yield from texts(value)


def test_bank_is_valid_against_the_schema_and_a_broken_one_is_not():
    bank = quiz.bank()
    schema = json.loads((resources.files("accumlib.quiz") / "schema.json").read_text())
    jsonschema.validate(bank, schema)
    broken = json.loads(json.dumps(bank))
    del broken["questions"][0]["options"][1]["feedback"]["hi"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_both_languages_have_the_same_questions_options_and_answers():
    questions = quiz.bank()["questions"]
    en, hi = quiz.Quiz(language="en"), quiz.Quiz(language="hi")
    assert [q["id"] for q in en.questions] == [q["id"] for q in hi.questions]
    for text in texts(quiz.bank()["questions"]):
        assert text["en"].strip() and DEVANAGARI.search(text["hi"]), text
    for q in questions:  # options and answers are shared by both languages, so only the texts can differ
        assert ("options" in q) == (q["kind"] != "number")
        assert q["kind"] == "number" or q["answer"] in [o["id"] for o in q["options"]]
    assert set(quiz.bank()["ui"]["en"]) == set(quiz.bank()["ui"]["hi"])
    # PyTorch names stay in Latin script in Hindi
    assert "optimizer.step()" in next(q for q in questions if q["id"] == "when-to-step")["prompt"]["hi"]


def test_every_lesson_topic_is_covered_with_a_numeric_and_a_predict_question():
    questions = quiz.bank()["questions"]
    assert {q["topic"] for q in questions} == TOPICS
    assert any(q["kind"] == "number" for q in questions) and any(q["kind"] == "predict" for q in questions)
    central = next(q for q in questions if q["id"] == "when-to-step")
    assert "(step + 1) % accum_steps == 0" in central["explanation"]["en"]
    assert "last" in central["explanation"]["en"] and len(central["options"]) >= 4


def test_first_wrong_answer_reveals_the_hint_not_the_answer_and_retries_count():
    q = quiz.Quiz(["when-to-step", "effective-batch"])
    first = q.answer("when-to-step", "a")
    assert not first.correct and first.hint and "every mini-batch" in first.message
    assert "(step + 1)" not in first.message + first.hint  # the answer is not given away
    assert q.progress() == (1, 0, 2)
    right = q.answer("when-to-step", "c")
    assert right.correct and "(step + 1) % accum_steps == 0" in right.message
    assert q.answer("effective-batch", "64").correct  # 8 x 4 x 2
    assert not q.answer("effective-batch", 32).correct
    assert q.progress() == (2, 2, 2)


def test_bad_answers_and_ids_are_named():
    q = quiz.Quiz(["when-to-step", "effective-batch"])
    with pytest.raises(ValueError, match="'z' is not an option of 'when-to-step'"):
        q.answer("when-to-step", "z")
    with pytest.raises(ValueError, match="needs a number, got 'many'"):
        q.answer("effective-batch", "many")
    with pytest.raises(ValueError, match="unknown question id"):
        quiz.Quiz(["nope"])
    with pytest.raises(ValueError, match="language must be one of"):
        quiz.Quiz(language="fr")


def test_predict_question_runs_real_code():
    q = quiz.Quiz(["predict-classic-division"])
    output = q.run_check("predict-classic-division")
    classic = float(re.search(r"classic\): ([0-9.e+-]+)", output).group(1))
    assert classic > 1e-3 and "accumlib): below 1e-12" in output


def test_widget_language_switch_progress_and_feedback():
    widget = quiz.QuizWidget()
    assert widget.language.value == "en" and "Quick check" in widget.heading.value
    assert widget.check.description == "Check"
    widget.choices.value = "a"
    widget.submit()
    assert "Not quite" in widget.feedback.value and "Hint" in widget.feedback.value
    widget.choices.value = "c"
    assert widget.submit().correct
    assert "answered 1 · correct 1" in widget.progress.value
    widget.language.value = "hi"
    assert widget.check.description == "जाँचें" and "optimizer.step()" in widget.prompt.value
    assert widget.choices.options[0][0] == "हर mini-batch के बाद"
    assert "उत्तर दिए 1 · सही 1" in widget.progress.value
    widget.go(4)
    assert widget.current["kind"] == "number" and widget.number.layout.display is None
    widget.number.value = 64
    assert widget.submit().correct
    widget.go(99)
    assert widget.index == len(widget.quiz.questions) - 1
    assert all(c.description for c in (widget.language, widget.check, widget.next, widget.previous))
