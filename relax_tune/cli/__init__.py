"""The ``relax-tune`` command line: tune, compile, report, demo and the database tools."""

from .main import main

__all__ = ["main"]
