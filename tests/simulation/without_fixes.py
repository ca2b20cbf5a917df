"""A pytest plugin that takes fixes out for a whole run: ``PUSHGATE_TEST_WITHOUT=name,...``
and ``pytest -p tests.simulation.without_fixes TESTS`` apply those ablations (ablations.py)
before any test runs. test_fixes_pinned.py runs each fix's pinning tests so, in a pytest of
their own, and needs them to fail: the normal suite never loads this plugin."""

from __future__ import annotations

import os

import pytest

from .ablations import take_out

WITHOUT_ENV = "PUSHGATE_TEST_WITHOUT"


def pytest_configure(config: pytest.Config) -> None:
    names = [name.strip() for name in os.environ.get(WITHOUT_ENV, "").split(",") if name.strip()]
    take_out(names)
