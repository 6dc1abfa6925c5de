"""The ``relax-tune`` command line: tune, compile, report, demo and the database tools."""

from .commands import main

__all__ = ["main"]
