"""The global options (``--url``, ``--namespace``) and the App built from them, or
loaded from a user's module (``MODULE:APP``) with those options applied."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import click

from ferryq.app import App
from ferryq.cli.output import CliError
from ferryq.policy import JobOptions


@dataclass
class Settings:
    """The global options, and the App built from them on first use."""

    url: str
    namespace: str
    url_given: bool
    namespace_given: bool
    app: App | None = field(default=None, repr=False)


def settings(ctx: click.Context) -> Settings:
    found = ctx.find_object(Settings)
    assert found is not None, "the root command sets Settings"
    return found


def get_app(ctx: click.Context, target: str | None = None, *, read_only: bool = False) -> App:
    """The App for ``--url``/``--namespace`` (or the one at ``target``), closed at the end.
    A command that only reads says so (``read_only``): it creates no SQLite file."""
    config = settings(ctx)
    if config.app is None:
        if target is None:
            config.app = App(config.url, namespace=config.namespace, read_only=read_only)
        else:
            config.app = configured(load_app(target), config)
        ctx.find_root().call_on_close(config.app.close)
    return config.app


def configured(app: App, config: Settings) -> App:
    """A user's App with the ``--url``/``--namespace`` given on the command line applied."""
    if config.url_given:
        app.url = config.url
    if config.namespace_given:
        JobOptions(namespace=config.namespace).validate()
        app.namespace = config.namespace
    return app


def load_app(target: str) -> App:
    """Import ``module:attribute`` (the attribute defaults to ``app``) and check it."""
    module_name, _, attribute = target.partition(":")
    attribute = attribute or "app"
    if not module_name or module_name.startswith("."):
        raise CliError(f"{target!r} is not MODULE:APP (for example myproject.jobs:app)")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        found: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise CliError(
                f"cannot import module {module_name!r}: no module named {missing!r} "
                "(searched the current folder and sys.path)"
            ) from None
        raise  # the module exists but one of its own imports fails: show where
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise CliError(f"module {module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not isinstance(found, App):
        raise CliError(f"{module_name}:{attribute} is a {type(found).__name__}, not a ferryq.App")
    return found
