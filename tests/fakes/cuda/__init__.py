"""Fake cuda-python (tests only)."""
