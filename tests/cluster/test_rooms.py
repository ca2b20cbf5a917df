"""The cluster package's rooms keep their walls (ARCHITECTURE.md, "The cluster").

The gateway side (``client/``) and the node side (``node/``) never import each other, so a
``cluster://`` gateway does not load the LMDB engine or replication, and replication sees the
store only through ``ReplicaStore``. This test reads every import statement of the package
(``ast``, no import side effects) and holds each room to the rooms it may use.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import backend_store.cluster

PACKAGE = Path(backend_store.cluster.__file__).parent

# room -> the cluster rooms and backend_store modules it may import
ALLOWED_ROOMS: dict[str, set[str]] = {
    "protocol": {"protocol"},
    "coordination": {"coordination"},
    "replication": {"replication", "protocol"},
    "node": {"node", "protocol", "coordination", "replication"},
    "manager": {"manager", "coordination"},
    "client": {"client", "protocol", "coordination"},
}
# backend_store modules outside the cluster package that only the node side may use
NODE_ONLY = {"lmdb_store"}


def _imports(path: Path) -> list[tuple[str, ...]]:
    """Every imported module of ``path`` as a tuple of parts below ``backend_store``."""
    module = path.relative_to(PACKAGE.parent.parent).with_suffix("").parts
    package = module[:-1]
    found: list[tuple[str, ...]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = (*base, *(node.module.split(".") if node.module else ()))
                names = [(*target, alias.name) for alias in node.names] if not node.module else [target]
            else:
                names = [tuple((node.module or "").split("."))]
            found.extend(names)
        elif isinstance(node, ast.Import):
            found.extend(tuple(alias.name.split(".")) for alias in node.names)
    return [name[1:] for name in found if name[:1] == ("backend_store",)]


def test_each_room_imports_only_the_rooms_below_it() -> None:
    rooms = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert rooms == set(ALLOWED_ROOMS), "a new room needs its walls in this test and ARCHITECTURE.md"
    wrong: list[str] = []
    for room in sorted(rooms):
        for path in sorted((PACKAGE / room).glob("*.py")):
            for target in _imports(path):
                if target[:1] == ("cluster",) and len(target) > 1 and target[1] in ALLOWED_ROOMS:
                    if target[1] not in ALLOWED_ROOMS[room]:
                        wrong.append(f"{room}/{path.name} imports cluster.{target[1]}")
                elif target[:1] == ("cluster",):
                    wrong.append(f"{room}/{path.name} imports {'.'.join(target)} (outside the rooms)")
                elif target[:1] and target[0] in NODE_ONLY and room != "node":
                    wrong.append(f"{room}/{path.name} imports {target[0]}")
    assert wrong == []


def test_a_cluster_gateway_loads_neither_the_store_engine_nor_the_node_side() -> None:
    code = (
        "import sys; import backend_store.cluster.client.cluster_backend; "
        "print(sorted(m for m in sys.modules if m.startswith(('backend_store.lmdb_store', "
        "'backend_store.cluster.node', 'backend_store.cluster.replication', 'backend_store.cluster.manager', "
        "'lmdb'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
