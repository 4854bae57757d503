"""`gantry`: the command-line client of the Gantry REST API.

A plain HTTP client (standard library only): it never imports Django or the server's
apps, so it can ship on its own.
"""

__version__ = "0.1.0"
