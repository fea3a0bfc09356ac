"""accumlib.lessons without its `lessons` extra: importing a lesson module refuses with the command that installs
what is missing, in the course language (accumlib/lessons/__init__.py)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("language", ["en", "hi"])
@pytest.mark.parametrize("hidden", ["matplotlib", "ipywidgets", "IPython"])
def test_the_lessons_without_their_extra_say_how_to_install_it(hidden, language):
    """A lesson module where one of the extra's packages is missing (hidden from the import system) refuses with
    the command that installs it, in the course language, before anything else is imported."""
    code = (
        f"import sys; sys.modules[{hidden!r}] = None\n"  # as if not installed: find_spec finds nothing
        f"import accumlib; accumlib.set_language({language!r})\n"
        "try:\n    from accumlib.lessons import quiz\n"
        "except ModuleNotFoundError as error:\n    print(error.name, '|', error)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    name, message = done.stdout.strip().split(" | ")
    assert name == hidden and hidden in message and 'pip install "accumlib[lessons]"' in message, done.stdout
    assert ("lessons' extra" in message) == (language == "en")
