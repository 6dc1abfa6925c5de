"""Developer tools that sit beside the package and are never shipped in the wheel: they are run
from the repository root as modules (``python -m tools.prior.train_prior``), so that they import
each other and ``relax_tune`` by package path, with no edits of ``sys.path``."""
