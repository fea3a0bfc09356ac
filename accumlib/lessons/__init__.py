"""What serves the lessons, on top of the library: nothing here is needed to train with accumlib.

`data` and `models` (the digits and the lessons' small models), `pitfalls` (the classic loop with its bugs as
switches), `show` (what each lesson prints and draws), `plots`, `widgets` (the dashboards), `quiz` and `exercises`
(the checkers). They need the `lessons` extra (matplotlib, ipywidgets, jsonschema); `import accumlib` imports none
of them. A notebook imports what it uses: `from accumlib.lessons import data, exercises, models, quiz, show`.
"""
