#!/usr/bin/env python
"""The shop's manage.py: ``python examples/django_shop/manage.py migrate``, then
``... runserver`` in one terminal and ``... ferryq worker`` in another.

SHOP_DATABASE_URL chooses the database (``sqlite:///shop.db`` by default, or
``postgresql://user:password@host:port/name``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's root
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_shop.shop_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
