"""``python manage.py ferryq ...``: ferryq's command line (``ferryq ...``) with Django
set up, on the project's App: ``manage.py ferryq worker``, ``... jobs ls``,
``... server``, every command and option of ``ferryq --help``.

The App's URL and namespace come from the settings (``FERRYQ``, ``DATABASES``);
``--url`` and ``--namespace`` given here still win. ``worker`` needs no MODULE:APP: it
runs the tasks of every installed app's ``tasks.py``. Worker processes of
``--processes`` are ``python -m ferryq`` children that set Django up themselves, from
the same DJANGO_SETTINGS_MODULE and the same import path.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ferryq.contrib.django import get_app

#: The App that ``ferryq worker`` and ``ferryq enqueue --app`` load when given none.
APP_TARGET = "ferryq.contrib.django:app"
#: What ``run`` sets in the environment, for ferryq's command line and its children.
ENVIRONMENT = ("FERRYQ_URL", "FERRYQ_APP", "FERRYQ_DIRECT_URL", "PYTHONPATH")


class Command(BaseCommand):
    help = "ferryq's command line on the project's App: manage.py ferryq --help"

    def run_from_argv(self, argv: list[str]) -> None:
        """Every argument after ``ferryq`` goes to ferryq's own parser, as given."""
        run(argv[2:], prog_name=f"{os.path.basename(argv[0])} {argv[1]}")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("args", nargs="*", help="ferryq's command and its arguments")

    def handle(self, *args: str, **options: Any) -> None:
        """``call_command("ferryq", "jobs", "ls")``: returns once the command succeeded;
        one that failed raises CommandError with its exit code (ferryq's command line
        ends the process, which a caller of call_command does not expect). The caller's
        environment is left as it was."""
        saved = {name: os.environ.get(name) for name in ENVIRONMENT}
        try:
            run(list(args), prog_name="ferryq")
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise CommandError(f"ferryq {' '.join(args)} exited with {exc.code}") from exc
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def run(args: list[str], prog_name: str) -> None:
    """ferryq's command line on ``args``, with the project's URL, namespace and App."""
    from ferryq.cli import cli

    app = get_app()
    os.environ["FERRYQ_URL"] = app.url
    os.environ["FERRYQ_APP"] = APP_TARGET
    if app.direct_url:
        os.environ.setdefault("FERRYQ_DIRECT_URL", app.direct_url)
    # Children (worker --processes) import the project from where this process does.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [sys.path[0], *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    if app.namespace != "default" and not any(a.startswith("--namespace") for a in args):
        args = ["--namespace", app.namespace, *args]
    cli.main(args=args, prog_name=prog_name)
