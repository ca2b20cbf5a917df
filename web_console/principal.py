"""What the console needs to know of an authenticated token."""

from __future__ import annotations

from typing import Protocol


class PrincipalLike(Protocol):
    """What an authenticated token says (the gateway's Principal fits)."""

    @property
    def tenant(self) -> str: ...

    @property
    def subject(self) -> str: ...

    @property
    def scopes(self) -> frozenset[str]: ...

    @property
    def expires_at(self) -> float | None: ...

    # The records the credential stands on, kept in the session to check it again.
    @property
    def key_id(self) -> str | None: ...

    @property
    def kid(self) -> str | None: ...

    @property
    def via(self) -> str | None: ...
