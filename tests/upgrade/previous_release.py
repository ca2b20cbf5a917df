"""A cluster's data as an earlier release left it, for the upgrade-in-place test.

``make`` runs a whole cluster (one etcd member, three nodes, a manager, a gateway on
``cluster://``) from the code in ``--code`` (a checkout of the earlier release: its
``pushgate`` is imported from there), creates queues and sends messages through the
gateway's HTTP API as a user would, stops everything cleanly (gateway, manager, nodes, then
etcd), and packs the data directories with a manifest of what was acknowledged::

    python -m tests.upgrade.previous_release --code /path/to/old/checkout --out FILE.tar.gz

``tests/upgrade/test_upgrade_in_place.py`` makes the archive from commit a948aa2 (the last
release with one partition per queue, taken from the repository's history) each time it
runs, unpacks it and starts today's code on it; the manifest names the commit. (An archive
kept in the tree aged: its messages outlived their queues' 4-day retention.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from .cluster_dirs import ClusterDirs

# What the archive holds: the queues (and their attributes) and how many messages each got.
QUEUES: dict[str, dict[str, object]] = {
    "inbox-1": {},
    "inbox-2": {},
    "inbox-3": {"visibility_timeout_s": 5},
    "wide": {"partitions": 2},
    "orders-dlq": {},
    # One message of ``orders`` is dead-lettered: its copy of ``orders-dlq`` holds it.
    "orders": {"dead_letter_queue": "orders-dlq", "max_receives": 1},
}
MESSAGES_PER_QUEUE = 5
TENANT = "default"


def make(code: Path, out: Path, commit: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="pushgate-previous-"))
    cluster = ClusterDirs(work / "cluster", work / "logs", code=code)
    try:
        cluster.start()
        key = (cluster.root / "gateway" / "bootstrap-admin-key").read_text().strip()
        sent = _populate(cluster.url, key, commit)
        cluster.stop()
        manifest = {
            "commit": commit,
            "tenant": TENANT,
            "admin_key": key,
            "queues": {name: {"attributes": attrs, "bodies": sent[name]} for name, attrs in QUEUES.items()},
        }
        (cluster.root / "manifest.json").write_text(json.dumps(manifest, indent=1))
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz") as tar:
            tar.add(cluster.root, arcname="cluster")
    except BaseException:
        cluster.stop()
        sys.stderr.write(cluster.log_tails())
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _populate(url: str, key: str, commit: str) -> dict[str, list[str]]:
    """The queues and messages, through the HTTP API; the bodies each queue holds."""
    sent: dict[str, list[str]] = {}
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        for name, attributes in QUEUES.items():
            http.put(f"/v1/queues/{name}", json=attributes).raise_for_status()
        # Received once and given back: the next receive moves it to the dead-letter
        # queue (a copy of which lives in the partitions of ``orders``).
        poison = f"orders poison from {commit}"
        http.post("/v1/queues/orders/messages", json={"body": poison}).raise_for_status()
        for _ in range(100):
            got = http.post("/v1/queues/orders/receive", json={"max": 1}).raise_for_status().json()
            receipts = [m["receipt"] for m in got["messages"]]
            if receipts:
                http.post("/v1/queues/orders/nack", json={"receipts": receipts}).raise_for_status()
            if http.get("/v1/queues/orders-dlq").json()["stats"]["visible"] == 1:
                break
        else:
            raise SystemExit("the nacked message of orders never reached orders-dlq")
        for name in QUEUES:
            bodies = [f"{name} message {i} from {commit}" for i in range(MESSAGES_PER_QUEUE)]
            for body in bodies:
                http.post(f"/v1/queues/{name}/messages", json={"body": body}).raise_for_status()
            sent[name] = bodies
        sent["orders-dlq"].append(poison)
    return sent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--code", type=Path, required=True, help="a checkout of the earlier release")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "-C", str(args.code), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    make(args.code.resolve(), args.out.resolve(), commit)
    print(f"wrote {args.out} (release {commit})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
