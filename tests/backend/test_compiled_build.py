"""The build in place is the one the run says it is: every module scripts/build-compiled
compiles is imported from its extension in the compiled build, from its source in the pure
one, and never half and half (a module that fell back to its ``.py`` while the others are
compiled is a build that failed without saying so).

``PUSHGATE_BUILD`` (``compiled`` or ``pure``) names the build a run means to test
(bench/README.md, "Compiling the message path"); unset, the build must only be whole."""

from __future__ import annotations

import importlib
import os
import runpy
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The build script's own list (a script, not a package: loaded by path).
modules: Callable[[], list[str]] = runpy.run_path(str(REPO / "scripts" / "build_compiled.py"))["modules"]


def imported_from() -> dict[str, str]:
    return {name: importlib.import_module(name).__file__ or "" for name in modules()}


def test_the_compiled_modules_are_all_compiled_or_all_pure() -> None:
    files = imported_from()
    assert files, "scripts/compiled-modules.txt lists no module"
    compiled = {name for name, path in files.items() if path.endswith(".so")}
    expected = os.environ.get("PUSHGATE_BUILD")
    if expected == "compiled":
        assert compiled == set(files), f"imported from source in the compiled build: {set(files) - compiled}"
    elif expected == "pure":
        assert not compiled, f"compiled in the pure build: {compiled}"
    else:
        assert compiled in (set(), set(files)), f"a partial build: only {sorted(compiled)} compiled"
