"""docs/api.md is the API reference generated from the docstrings (tools/api_docs.py): it must not go stale, and it
must cover every name `accumlib` exports."""

import importlib.util
from pathlib import Path

import accumlib

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("api_docs", ROOT / "tools" / "api_docs.py")
api_docs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(api_docs)


def test_the_reference_is_up_to_date():
    assert api_docs.OUT.read_text(encoding="utf-8") == api_docs.render(), "run: python tools/api_docs.py"


def test_every_exported_name_has_a_section_with_its_docstring():
    text = api_docs.render()
    for name in accumlib.__all__:
        obj = getattr(accumlib, name)
        if callable(obj):
            assert f"### `accumlib.{name}(" in text, name
            assert (obj.__doc__ or "").strip().splitlines()[0].strip() in text, f"{name}'s docstring is missing"
