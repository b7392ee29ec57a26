"""Puts this folder on ``sys.path`` so test modules can ``from _counting_backend import
CountingBackend`` (pytest runs with ``--import-mode=importlib``, which does not), and gives
them ``fresh_frontend`` (``pytestmark = pytest.mark.usefixtures("fresh_frontend")``)."""

import logging
import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def fresh_frontend():
    """Every cache entry, skip mark and counter forgotten before and after the test."""
    from kiln_frontend import reset

    reset()
    yield
    reset()


@pytest.fixture
def clean_eval_frame_hook():
    """No eval-frame callback and no cache entries before the test; the callback it found
    restored and the entries forgotten after (the C hook's own tests)."""
    from kiln_frontend import _evalframe

    prev = _evalframe.set_eval_frame(None)
    _evalframe.reset()
    yield
    _evalframe.set_eval_frame(prev)
    _evalframe.reset()


@pytest.fixture
def no_internal_errors(caplog):
    """The test logs no internal error of kiln's (``kiln.internal_errors``) and counts none."""
    from kiln_frontend.eval_frame import counters

    caplog.set_level(logging.INFO, logger="kiln.internal_errors")
    yield
    assert counters["internal_errors"] == 0
    assert not [r for r in caplog.records if r.name == "kiln.internal_errors"]
