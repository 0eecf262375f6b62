"""Backends. Each module is imported only when its URL scheme is used."""
