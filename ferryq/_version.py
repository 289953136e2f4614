"""ferryq's version, as pyproject.toml states it: ``ferryq.__version__``."""

__version__ = "0.1.0"
