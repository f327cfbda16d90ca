"""The base of cutetune's Inductor graph passes: each takes one custom-pass slot of Inductor's
config and runs the user's own pass of that slot first."""

from __future__ import annotations

import pickle
from typing import Callable

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass


class ChainedPass(CustomGraphPass):
    """``apply(graph)`` after ``user_pass`` (the slot's previous pass, if any: a
    CustomGraphPass or a plain function); ``key`` says what decides, and goes with the user's
    pass into ``uuid()``, so into Inductor's cache key."""

    NAME = "cutetune"

    def __init__(self, key: str, user_pass: Callable[[torch.fx.Graph], None] | None = None
                 ) -> None:
        self.key, self.user_pass = key, user_pass

    def uuid(self) -> str | None:
        """None where the user's pass has no uuid (a plain function, say): Inductor then
        bypasses its caches, as it would for that pass alone."""
        if self.user_pass is None:
            return f"{self.NAME}:{self.key}:None"
        user = self.user_pass.uuid() if isinstance(self.user_pass, CustomGraphPass) else None
        return f"{self.NAME}:{self.key}:{user!r}" if user else None

    def __reduce__(self):
        """What pickling makes of the pass: its uuid. torch 2.11's FX-graph cache key pickles
        the pre-grad slot with the rest of Inductor's config (later releases ask its uuid), and
        a pass holding closures failed there, so every graph compiled with it bypassed the
        cache (seen on the H200 host with the early-prefetch pass). With no uuid it does not
        pickle, which bypasses the cache as the uuid's absence does elsewhere."""
        uuid = self.uuid()
        if uuid is None:
            raise pickle.PicklingError(f"{type(self).__name__} has no uuid: its user pass "
                                       "has none")
        return str, (uuid,)

    def __deepcopy__(self, memo) -> "ChainedPass":
        """The pass itself: Inductor deep-copies its config (to restore it later, say), and
        a copy must stay a pass, not the str that pickling makes of it."""
        return self

    def __copy__(self) -> "ChainedPass":
        return self

    def __call__(self, graph: torch.fx.Graph) -> None:
        if self.user_pass is not None:
            self.user_pass(graph)
        self.apply(graph)

    def apply(self, graph: torch.fx.Graph) -> None:
        raise NotImplementedError
