"""Errors raised while a graph is built."""


class GraphBuildError(ValueError):
    """An op was given operands it cannot combine; the message names the op and the shapes."""
