"""Integrations of ferryq with frameworks, each imported only by who uses it."""
