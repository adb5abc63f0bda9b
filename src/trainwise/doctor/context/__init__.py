"""What a rule knows about one file: parents, scopes, bindings, import aliases, and the roles of variables.

Built in one pass over the ``ast`` tree before the rules run; the role questions (is this a loader? a model? a
tensor that carries a graph?) are answered lazily and cached. Every predicate leans towards "no" when unsure:
a doctor that cries wolf gets switched off.

The analysis is split by what it knows: :mod:`.syntax` (shared helpers), :mod:`.index` (the one-pass index,
structure and names), :mod:`.autograd`, :mod:`.roles` and :mod:`.calls`; :class:`Context` puts them together.
"""

from __future__ import annotations

from trainwise.doctor.context.autograd import AutogradFacts
from trainwise.doctor.context.calls import CallGraph
from trainwise.doctor.context.index import FileIndex
from trainwise.doctor.context.roles import Roles
from trainwise.doctor.context.syntax import (
    DEFINITIONS,
    Binding,
    LoaderInfo,
    argument,
    dotted,
    has_star_kwargs,
    init_of,
    is_bound_method,
    is_const,
    is_param,
    keyword,
    last_name,
    method_call,
    names_in,
    position,
    walk_own,
)


class Context(CallGraph, Roles, AutogradFacts, FileIndex):
    """The parsed file and everything rules may ask about it (see docs/doctor-internals.md)."""


__all__ = [
    "DEFINITIONS",
    "Binding",
    "Context",
    "LoaderInfo",
    "argument",
    "dotted",
    "has_star_kwargs",
    "init_of",
    "is_bound_method",
    "is_const",
    "is_param",
    "keyword",
    "last_name",
    "method_call",
    "names_in",
    "position",
    "walk_own",
]
