"""docs/api.md's tables agree with the code: every error code with its status, every close
code with whether to reconnect. (The examples on the page run in test_doc_blocks.py.)"""

from __future__ import annotations

import re
from pathlib import Path

from gateway.errors import STATUS_BY_CODE
from push.close_codes import CloseCode

API = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()


def _section(title: str) -> str:
    start = API.index(f"## {title}") if f"## {title}" in API else API.index(f"### {title}")
    rest = API[start + len(title) + 3 :]
    end = re.search(r"^##", rest, re.M)
    return rest[: end.start()] if end else rest


def test_error_table_lists_every_code_with_its_status() -> None:
    documented: dict[str, int] = {}
    for status, codes in re.findall(r"^\| (\d{3}) \| (.+?) \|", _section("Error codes"), re.M):
        for code in re.findall(r"`([a-z_]+)`", codes):
            documented[code] = int(status)
    assert documented == STATUS_BY_CODE


def test_close_code_table_matches_the_code() -> None:
    rows = re.findall(r"^\| (\d{4}) \| .+? \| (.+?) \|$", _section("Close codes"), re.M)
    documented = {int(code): reconnect for code, reconnect in rows}
    assert set(documented) == {int(c) for c in CloseCode}
    for code in CloseCode:
        # "with a new token" (4001) is a no for a client that has none.
        assert (documented[int(code)] == "yes") is code.reconnect, code
