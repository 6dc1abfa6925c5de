"""Search strategies: where the next candidates of a task come from.

    search = make_search("replay", mod, target, seed=1)
    cands = search.next_candidates(8, exclude=keys_already_in_the_database)
"""

from __future__ import annotations

from typing import Callable

import tvm

from ..utils import RelaxTuneError
from .base import Candidate, SearchContext, SearchStrategy
from .evolutionary import EvolutionarySearch
from .replay import ReplaySearch

SearchFactory = Callable[..., SearchStrategy]
_SEARCHES: dict[str, SearchFactory] = {"replay": ReplaySearch, "evolutionary": EvolutionarySearch}


def search_names() -> list[str]:
    """The registered search strategy names."""
    return sorted(_SEARCHES)


def make_search(name: str, mod: tvm.IRModule, target: tvm.target.Target,
                seed: int = 1, context: SearchContext | None = None) -> SearchStrategy:
    """The search strategy registered as ``name`` ("replay", "evolutionary")
    for the workload ``mod`` on ``target``; ``context`` carries the shared cost model and
    the task's records (factories are called as ``factory(mod, target, seed=, context=)``)."""
    factory = _SEARCHES.get(name)
    if factory is None:
        raise RelaxTuneError(f"unknown search strategy {name!r}: use one of {search_names()}")
    return factory(mod, target, seed=seed, context=context or SearchContext())


__all__ = ["Candidate", "EvolutionarySearch", "ReplaySearch", "SearchContext", "SearchStrategy", "make_search",
           "search_names"]
