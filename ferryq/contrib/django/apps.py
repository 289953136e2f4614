"""The Django app ``ferryq.contrib.django`` (label ``ferryq``)."""

from __future__ import annotations

import importlib.util

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class FerryqConfig(AppConfig):
    name = "ferryq.contrib.django"
    label = "ferryq"
    verbose_name = "ferryq"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every installed app's tasks.py registers its tasks, in every process: a
        # worker then knows the tasks a web process enqueues.
        autodiscover_modules("tasks")
        if importlib.util.find_spec("django_tasks") is not None:
            from ferryq.contrib.django import backend

            backend.register()  # the ferryq task that runs django.tasks jobs
