"""The package version, in a module of its own so that code anywhere in the package can
name it without importing the package's entry points (pyproject reads it too)."""

__version__ = "0.1.0"
