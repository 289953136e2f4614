"""Small programs that show ferryq at work; run each with ``python -m examples.NAME``."""
