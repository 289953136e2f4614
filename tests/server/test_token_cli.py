"""``ferryq token create|ls|revoke`` against the database a real server reads."""

from __future__ import annotations

import json
import subprocess

import httpx

from tests.commands import run_ferryq
from tests.processes import wait_until
from tests.server.harness import ServerProcess, new_namespace


def ferryq(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    """``ferryq --url URL token ARGS`` in this process (tests/commands.py)."""
    return run_ferryq(["--url", server.url, "token", *args])


def publish(server: ServerProcess, namespace: str, token: str) -> int:
    with httpx.Client(base_url=server.api, timeout=10) as api:
        return api.put(f"/api/{namespace}/q", content=b"x", headers={"X-Token": token}).status_code


def test_a_token_made_on_the_command_line_works_until_revoked(server: ServerProcess) -> None:
    ns = new_namespace()
    made = ferryq(server, "create", ns, "-d", "billing service")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert len(token) == 26
    assert publish(server, ns, token) == 201
    assert publish(server, new_namespace(), token) == 401  # its namespace only

    listed = ferryq(server, "ls", ns, "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert (entry["namespace"], entry["description"]) == (ns, "billing service")
    assert entry["hint"] == token[:6] + "…"
    assert token not in listed.stdout  # stored as a digest: never shown again
    assert ns in ferryq(server, "ls").stdout

    revoked = ferryq(server, "revoke", ns, token)
    assert revoked.returncode == 0, revoked.stderr
    assert ferryq(server, "ls", ns, "--json").stdout.strip() == "[]"
    # The server forgets a cached token within seconds.
    wait_until(lambda: publish(server, ns, token) == 401, within=30, interval=0.2,
               what="the revoked token refused")  # fmt: skip


def test_a_chosen_token(server: ServerProcess) -> None:
    ns = new_namespace()
    chosen = f"chosen-{new_namespace()}-abcdefgh"
    made = ferryq(server, "create", ns, "-d", "chosen", "--token", chosen, "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout) == {"namespace": ns, "token": chosen, "description": "chosen"}
    assert publish(server, ns, chosen) == 201
    again = ferryq(server, "create", ns, "-d", "again", "--token", chosen)
    assert (again.returncode, again.stdout) == (2, "")
    assert "exists already" in again.stderr


def test_bad_input_exits_2_and_changes_nothing(server: ServerProcess) -> None:
    ns = new_namespace()
    for args, message in [
        (("create", "bad ns!", "-d", "x"), "invalid namespace"),
        (("create", "a.b", "-d", "x"), "jobs may use . and : too, but not over HTTP"),
        (("create", ns, "-d", "x", "--token", "short"), "at least 20 characters"),
        (("create", ns, "-d", "x", "--token", "pool:" + "y" * 20), "cannot contain ':'"),
        (("create", ns, "-d", "x", "--token", " " * 25), "spaces or control characters"),
        (("create", ns, "-d", "x", "--token", "y" * 20 + " z"), "spaces or control characters"),
        (("create", ns, "-d", "x", "--token", "y" * 20 + "\t"), "spaces or control characters"),
        (("create", ns, "-d", "x", "--token", "y" * 20 + "\x7f"), "spaces or control characters"),
        (("create", ns), "Missing option"),
        (("revoke", ns, "no-such-token-anywhere-at-all"), "no such token"),
    ]:
        result = ferryq(server, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
    assert ferryq(server, "ls", ns, "--json").stdout.strip() == "[]"
