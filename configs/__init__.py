"""Build profiles shipped as package data (see builder/config.py)."""
