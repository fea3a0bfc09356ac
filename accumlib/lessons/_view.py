"""A widget's display bundle under ipywidgets 8 (the lessons' pin) and 7.7 (Colab's, which the lessons accept).

ipywidgets 8 gives every widget `_repr_mimebundle_`; 7.7 displays a widget through `_ipython_display_` instead,
with the same two entries (its text and the view of its model), built here the way 7.7 builds them.
"""

from __future__ import annotations


def view_bundle(widget, include=None, exclude=None) -> dict:
    """The widget's display data: the widget-view entry a front end draws and a text/plain one."""
    if hasattr(widget, "_repr_mimebundle_"):
        return widget._repr_mimebundle_(include=include, exclude=exclude)
    return {
        "text/plain": repr(widget),  # ipywidgets 7
        "application/vnd.jupyter.widget-view+json": {
            "version_major": 2,
            "version_minor": 0,
            "model_id": widget._model_id,
        },
    }
