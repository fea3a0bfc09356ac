"""What the website shows that only the lessons' own code can compute: the quiz, graded by accumlib's quiz, and
the dashboards' figures and findings for each setting. Run with the lessons' Python (torch, matplotlib,
ipywidgets); tools/site.py runs it and reads what it writes (the site's builder has none of the lessons' stack).

    python tools/site_data.py --out build/site-data [--only quiz|dashboards]

Writes <out>/quiz.json: per language, the quiz's labels and every question of the bank as accumlib.lessons.quiz
loads and grades it (the prompt, the options in the order a learner with the website's seed sees them, what each
option's answer says, the hint; for a number question the answer and its known wrong answers; for a "predict, then
run it" question the text of its experiment, run here on the CPU). Nothing is copied from questions.json by hand:
a question changed in the bank changes on the website at its next build.

Writes <out>/dashboards/<language>/: each dashboard's figures (PNG, reduced to a 128-colour palette: about 12.6 KB
each, a third of matplotlib's) and its findings for every setting the website offers, and dashboards.json (the
controls' labels and values as the dashboard shows them, and per setting the figures' files and alt text and the
summary). The settings offered (about 450 figures per language, 5.6 MB):
  loss      every micro-batch size x every accum_steps (1-16), with every switch off and with "forget the
            division" (the switch its task uses; the others need the live notebook): 192 settings
  memory    every micro-batch size x accum_steps 1, 2, 4, 8, 16 x card 0.25, 0.5, 1, 2, 4 MiB (its tasks' settings
            are among them): 150 settings
  batchnorm every micro-batch size x every accum_steps: 96 settings (the second figure depends on the
            micro-batch size only: 6 files)
Each figure is computed by the dashboard's own `compute` for those settings, as a slider's change in the notebook
computes it.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # the website shows the CPU's results, as the stored notebooks do
os.environ.setdefault("ACCUMLIB_DEVICE", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import accumlib  # noqa: E402
from accumlib.i18n import LANGUAGES, catalogue  # noqa: E402
from accumlib.lessons import quiz, widgets  # noqa: E402
from accumlib.lessons.quiz.experiments import RUNS  # noqa: E402

SEED = "website"  # one order of the options for every reader of the website (a notebook shuffles per learner)


def quiz_data() -> dict:
    """{language: {"ui": {key: text}, "questions": {id: question}}}: everything the page's script needs."""
    measured = {}  # each experiment once: its numbers do not depend on the language
    for question in quiz.bank()["questions"]:
        if question["kind"] == "predict" and question["run"] not in measured:
            measured[question["run"]] = RUNS[question["run"]][0]()
    data = {}
    for language in LANGUAGES:
        grader = quiz.Quiz(language=language, seed=SEED)
        ui = {key: grader.text(text) for key, text in quiz.UI.items()}
        questions = {}
        for question in grader.questions:
            qid, entry = question["id"], {"kind": question["kind"], "lesson": question["lesson"]}
            entry["prompt"] = grader.text(question["prompt"])
            entry["hint"] = grader.text(question["hint"])
            if question["kind"] == "number":
                entry["answer"] = question["answer"]
                entry["right"] = grader.answer(qid, question["answer"]).message
                entry["known"] = [
                    [cause["answer"], grader.answer(qid, cause["answer"]).message]
                    for cause in question.get("known_wrong", [])
                ]
                entry["otherwise"] = grader.text(question["wrong_feedback"])
            else:
                entry["options"] = []
                for option in grader.options(qid):
                    feedback = grader.answer(qid, option["id"])
                    entry["options"].append(
                        {"text": grader.text(option["text"]), "right": feedback.correct, "feedback": feedback.message}
                    )
            if question["kind"] == "predict":
                entry["result"] = (
                    catalogue(language).gettext(RUNS[question["run"]][1]).format(**measured[question["run"]])
                )
            questions[qid] = entry
        data[language] = {"ui": ui, "questions": questions}
    return data


DASHBOARDS = {  # name: (class, accum_steps offered, extra settings offered: (setting, values) or None)
    "loss": (widgets.LossDashboard, range(1, widgets.MAX_ACCUM_STEPS + 1), ("switch", ["", "forget_division"])),
    "memory": (widgets.MemoryDashboard, (1, 2, 4, 8, 16), ("budget_mib", [0.25, 0.5, 1.0, 2.0, 4.0])),
    "batchnorm": (widgets.BatchNormDashboard, range(1, widgets.MAX_ACCUM_STEPS + 1), None),
}


class _Job:
    """A run that is never stale: what Dashboard.compute needs of its job."""

    def check(self) -> None:
        pass

    def draw(self, figures) -> None:  # partial figures while training: the website shows the final one only
        pass


def small_png(png: bytes) -> bytes:
    """The figure with a 128-colour palette (no dithering): the same picture at about a third of the bytes, its text
    chunks (the smallest font size, plots.SMALLEST_TEXT) and its dpi kept."""
    from PIL import Image, PngImagePlugin

    original = Image.open(io.BytesIO(png))
    chunks = PngImagePlugin.PngInfo()
    for name, value in original.text.items():
        chunks.add_text(name, value)
    image = original.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", optimize=True, pnginfo=chunks, dpi=original.info.get("dpi", (72, 72)))
    return buffer.getvalue()


def key(m: int, k: int, extra) -> str:
    """A setting's name, as site/_static/dashboards.js builds it from the controls."""
    return f"{m}|{k}|{extra}"


def dashboards_data(out: Path) -> None:
    """Every offered setting's figures and summary, per language (see the module's docstring)."""
    shared: dict[str, dict] = {}  # measurements that do not depend on the language, shared by both editions
    for language in LANGUAGES:
        accumlib.set_language(language)
        folder = out / "dashboards" / language
        folder.mkdir(parents=True, exist_ok=True)
        manifest = {}
        for name, (cls, steps, extra) in DASHBOARDS.items():
            dashboard = cls(device="cpu")
            for attribute in ("_curves", "_reports"):  # training runs and memory reports: language-free caches
                if hasattr(dashboard, attribute):
                    cache = shared.setdefault(f"{name}{attribute}", getattr(dashboard, attribute))
                    setattr(dashboard, attribute, cache)
            for control in dashboard.controls:  # set the controls without starting the dashboard's own runs
                control.unobserve(dashboard._changed, names="value")
            written: dict[str, str] = {}  # a figure's bytes (hashed) -> its file: identical figures stored once
            frames = {}
            extras = extra[1] if extra else [""]
            for m in widgets.MICRO_BATCH_SIZES:
                for k in steps:
                    for value in extras:
                        dashboard.micro_batch_size.value, dashboard.accum_steps.value = m, k
                        if name == "memory":
                            dashboard.budget.value = value
                        if name == "loss":
                            for switch, box in dashboard.switches.items():
                                box.value = switch == value
                        settings = dashboard.current_settings()
                        figures, finding = dashboard.compute(settings, _Job())
                        images = []
                        for figure in figures:
                            png = small_png(figure.png())
                            digest = hashlib.sha256(png).hexdigest()[:16]
                            if digest not in written:
                                written[digest] = f"{name}-{digest}.png"
                                (folder / written[digest]).write_bytes(png)
                            images.append([written[digest], figure.alt])
                        summary = f"{widgets._settings_line(settings)}\n{finding}"
                        dashboard._readout()  # the effective-batch line, as the dashboard writes it for these settings
                        frames[key(m, k, value)] = {
                            "images": images,
                            "summary": summary,
                            "readout": dashboard.effective.value,
                        }
            switches = [
                {"name": n, "label": box.description, "offered": n in extras}
                for n, box in getattr(dashboard, "switches", {}).items()
            ]
            manifest[name] = {
                "title": accumlib.i18n._(cls.title),
                "micro_batch_size": {
                    "label": dashboard.micro_batch_size.description,
                    "values": list(widgets.MICRO_BATCH_SIZES),
                    "default": 8,
                },
                "accum_steps": {"label": dashboard.accum_steps.description, "values": list(steps), "default": 4},
                "budget": (
                    {"label": dashboard.budget.description, "values": extras, "default": 0.5}
                    if name == "memory"
                    else None
                ),
                "switches": switches,
                "shown": accumlib.i18n._("the figure above, with these settings:"),
                "frames": frames,
            }
        (folder / "dashboards.json").write_text(json.dumps(manifest, ensure_ascii=False), encoding="utf-8")
    accumlib.set_language("en")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site-data")
    parser.add_argument("--only", choices=["quiz", "dashboards"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "quiz"):
        (args.out / "quiz.json").write_text(json.dumps(quiz_data(), ensure_ascii=False, indent=1), encoding="utf-8")
    if args.only in (None, "dashboards"):
        dashboards_data(args.out)
    print(f"site data: {args.out}")


if __name__ == "__main__":
    main()
