"""The versions of a dependency Pushgate was tested with, where it relies on more than the
dependency's public API; any other installed version is refused at start.

A module that reads a dependency's internals (a private class, a generator's code object)
names the range it was tested with and calls :func:`require` before it imports anything
private, so a release that moved those internals stops ``pushgate serve`` with a sentence
saying what to install, never with an ``ImportError`` or a fast path that silently does
something else. ``pyproject.toml`` bounds the same dependency to the same range (a test keeps
the two equal); docs/http.md, "Dependencies we rely on beyond their public API", lists each
reliance and why it is there. Moving a bound: install the new version, run the tests of the
module that relies on it and the push suites, then change the range in both places.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass

from .errors import ConfigurationError

_RELEASE = re.compile(r"\d+(?:\.\d+)*")


@dataclass(frozen=True, slots=True)
class VersionRange:
    """``lowest <= version < below``, compared by release numbers (``0.55.0rc1`` is 0.55.0:
    a pre-release of the bound is refused with it)."""

    distribution: str
    lowest: str
    below: str
    # What relies on it, for the refusal: "gateway/ws_server_protocol.py subclasses ...".
    reliance: str

    @property
    def specifier(self) -> str:
        """The range as pip writes it (and as ``pyproject.toml`` bounds it)."""
        return f">={self.lowest},<{self.below}"

    def admits(self, version: str) -> bool:
        release = _release(version)
        return _release(self.lowest) <= release < _release(self.below)


def require(tested: VersionRange, installed: str | None = None) -> None:
    """Refuse to go on unless the installed version of ``tested.distribution`` (or
    ``installed``) is in the tested range."""
    version = installed if installed is not None else importlib.metadata.version(tested.distribution)
    if not tested.admits(version):
        raise ConfigurationError(
            f"{tested.distribution} {version} is installed, but this Pushgate was tested only with "
            f"{tested.distribution}{tested.specifier}: {tested.reliance}; install a tested version "
            f"(pip install '{tested.distribution}{tested.specifier}')"
        )


def _release(version: str) -> tuple[int, ...]:
    """The release numbers a version starts with, trailing zeros dropped (``0.54.0`` ==
    ``0.54``)."""
    match = _RELEASE.match(version.strip())
    if match is None:
        raise ConfigurationError(f"cannot read the version {version!r}")
    numbers = [int(part) for part in match.group().split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)
