"""Compile the message path's plain-computation modules with mypyc, in place (README.md, "A compiled build").

Run through ``scripts/build-compiled`` (``--clean`` removes the build: the pure-Python
modules serve again). Each module in :data:`MODULES` becomes an extension module next to its
``.py`` (``records.cpython-311-x86_64-linux-gnu.so`` and its ``records__mypyc`` library),
which Python imports in preference to the source. The build fails loudly: a mypyc or C
compiler error stops it, and so does a module that still imports from its ``.py`` after the
build (checked in a fresh interpreter), so a silent fallback never passes for compiled.

What each candidate module saved in instructions per message, compiled against pure, is in
bench/README.md ("Compiling the message path"); the list holds only the modules that paid.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODULES_FILE = REPO / "scripts" / "compiled-modules.txt"


def modules() -> list[str]:
    """The modules the compiled build compiles (scripts/compiled-modules.txt, one a line)."""
    lines = MODULES_FILE.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def source(module: str) -> Path:
    return REPO / (module.replace(".", "/") + ".py")


def built_files(module: str) -> list[Path]:
    """The files a build leaves for ``module``: its extension and its mypyc library."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    stem = source(module).with_suffix("")
    return [stem.with_name(stem.name + suffix), stem.with_name(stem.name + "__mypyc" + suffix)]


def clean() -> None:
    for module in modules():
        for path in built_files(module):
            path.unlink(missing_ok=True)


def build(names: list[str]) -> None:
    # Imported here: --clean needs no compiler.
    from mypyc.build import mypycify
    from setuptools import Distribution  # type: ignore[import-untyped]

    paths = [str(source(name).relative_to(REPO)) for name in names]
    os.chdir(REPO)
    with tempfile.TemporaryDirectory(prefix="pushgate-mypyc-") as tmp:
        # One extension per module (separate=True): a module can be left out or removed alone.
        extensions = mypycify(paths, opt_level="3", separate=True, target_dir=tmp)
        # Distribution() rather than setup(): setup() would validate the project's
        # pyproject.toml with whatever setuptools the venv has, which this build does not need.
        dist = Distribution({"name": "pushgate-compiled", "ext_modules": extensions})
        dist.script_args = ["build_ext", "--inplace", "--build-temp", tmp, "--build-lib", tmp]
        dist.parse_command_line()
        dist.run_commands()


def imported_from(names: list[str]) -> dict[str, str]:
    """Where a fresh interpreter imports each module from."""
    code = (
        "import importlib, json, sys\n"
        "print(json.dumps({n: importlib.import_module(n).__file__ for n in sys.argv[1:]}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *names], cwd=REPO, check=True, capture_output=True, text=True
    )
    files: dict[str, str] = json.loads(out.stdout)
    return files


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clean", action="store_true", help="remove the compiled build (pure Python again)")
    parser.add_argument("modules", nargs="*", help="compile these instead of scripts/compiled-modules.txt's")
    args = parser.parse_args()
    clean()
    if args.clean:
        print("removed the compiled build: the pure-Python modules serve")
        return
    names = args.modules or modules()
    build(names)
    fallen_back = {name: path for name, path in imported_from(names).items() if not path.endswith(".so")}
    if fallen_back:
        sys.exit(f"build-compiled: these modules still import from their source: {fallen_back}")
    print(f"compiled {len(names)} modules: {', '.join(names)}")


if __name__ == "__main__":
    main()
