"""The library tests' own models and data (`from builders import data, models`): small, seeded, torch alone.

The library is tested without its lesson layer (accumlib.lessons): these are not the lessons' models and data, only
what the tests need. tests/course/test_suites.py's `test_library_tests_use_no_lesson_helper` keeps it so.
"""
