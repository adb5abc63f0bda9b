"""The version of trainwise, in a module of its own so that code inside the package can read it without
importing the package ``__init__`` from below."""

__version__ = "0.1.0"
