"""``ferryq ARGS`` run in the test's own process, for tests that read only what a command
prints and its exit code: a process would add only its start-up (0.2-0.6 s a command).

Tests of what needs a real process (signals, logging set-up, the interpreter's settings,
the installed script) start one instead.
"""

from __future__ import annotations

import subprocess
import traceback
from collections.abc import Mapping, Sequence

from click.testing import CliRunner

from ferryq.cli import cli


def run_ferryq(
    argv: Sequence[str], *, input: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ferryq ARGV`` run by the root command here, as the ``ferryq`` script runs it, with
    stdin (``input``), stdout and stderr of its own and ``env`` added to the environment
    while it runs. An exception it let out is shown in stderr as a process would show it."""
    result = CliRunner().invoke(
        cli, list(argv), input=input, env=dict(env or {}), prog_name="ferryq"
    )
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        assert result.exc_info is not None
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["ferryq", *argv], result.exit_code, result.stdout, stderr)
