"""The root of every error mqlake raises on purpose.

It lives in the lowest layer so that the store, the broker, the pipelines and the DAGs can all derive from it;
a command line catches ``MQLakeError`` and prints one line, while anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MQLakeError(Exception):
    """An error the user or operator can act on: bad input, a bad file, a refused request, a failed job."""
