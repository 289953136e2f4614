"""The worker: producer (claims), executor (attempts), completer (writes), maintenance."""

from ferryq.worker.runner import Worker

__all__ = ["Worker"]
