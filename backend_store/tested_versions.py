"""Whether an installed dependency is the release Pushgate's reliance on its internals was
tested with; on any other, the caller takes the dependency's public doors instead.

A module that reads a dependency's internals (a private class, a generator's code object)
names the range it was tested with (:class:`VersionRange`) and asks :meth:`ReleaseCheck.tested`
before it imports anything private. On another release it runs on what the dependency
offers publicly, and the check logs one warning naming the release and what that costs:
never a refusal to start (``pip install`` beside an application that needs a newer release
must resolve, and an upgrade must not stop ``pushgate serve``), never an ``ImportError`` or
a fast path that silently does something else. ``pyproject.toml`` bounds the dependency
below its next major release only; docs/http.md, "Dependencies we rely on beyond their
public API", lists each reliance, what it buys (measured) and how to move a tested range.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("pushgate.dependencies")

_RELEASE = re.compile(r"\d+(?:\.\d+)*")

# A distribution's installed version, by name (importlib.metadata's, or a test's).
InstalledVersion = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class VersionRange:
    """``lowest <= version < below``, compared by release numbers (``0.55.0rc1`` is 0.55.0:
    a pre-release of the bound is outside it)."""

    distribution: str
    lowest: str
    below: str
    # What relies on it: "gateway/ws_server_protocol.py subclasses ...".
    reliance: str
    # What another release costs, on the public doors: "WebSockets run on ...".
    fallback: str

    @property
    def specifier(self) -> str:
        """The range as pip writes it."""
        return f">={self.lowest},<{self.below}"

    def admits(self, version: str) -> bool:
        """Whether ``version`` is in the range (one it cannot read is not)."""
        return _release(self.lowest) <= _release(version) < _release(self.below)


class ReleaseCheck:
    """Asks whether each relied-on dependency is installed in its tested range, and warns,
    once per distribution and for as long as this check lives, when it is not.

    The process has one (:data:`RELEASES`); a test makes its own with an ``installed`` that
    reports another release, and hands it to what chooses (``gateway.server.uvicorn_config``,
    ``EtcdCoordinator``): the same path an untested release takes."""

    def __init__(self, installed: InstalledVersion = importlib.metadata.version) -> None:
        self._installed = installed
        self._warned: set[str] = set()

    def version(self, distribution: str) -> str:
        return self._installed(distribution)

    def tested(self, tested: VersionRange) -> bool:
        """Whether the installed release is in ``tested``'s range; if not, the warning."""
        version = self.version(tested.distribution)
        if tested.admits(version):
            return True
        if tested.distribution not in self._warned:
            self._warned.add(tested.distribution)
            log.warning(
                "%s %s is not a release this Pushgate was tested with (%s%s), where %s: %s "
                "(docs/http.md, dependencies; pip install '%s%s' for the tested one)",
                tested.distribution,
                version,
                tested.distribution,
                tested.specifier,
                tested.reliance,
                tested.fallback,
                tested.distribution,
                tested.specifier,
            )
        return False


# The process's check: what `pushgate serve`, `node` and `manager` choose by.
RELEASES = ReleaseCheck()


def _release(version: str) -> tuple[int, ...]:
    """The release numbers a version starts with, trailing zeros dropped (``0.54.0`` ==
    ``0.54``); none for a version that does not start with one (below every range)."""
    match = _RELEASE.match(version.strip())
    if match is None:
        return ()
    numbers = [int(part) for part in match.group().split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)
