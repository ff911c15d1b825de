"""The one error type that bad input raises.

Every loader and validator in pipeplan reports a problem with its input as an
:class:`InputError` carrying the file, the place inside it and what is wrong.  The
CLI turns it into the single line ``error: <file>: <where>: <what>`` and exit
status 2; nothing else ever reaches the user as a traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """A problem with user input: a file, a field inside it, or a combination.

    Parameters
    ----------
    file : str
        The file the problem is in (``"-"`` when there is no file).
    where : str
        The place inside it, as a JSON path such as ``stages[1].devices[0]``.
    what : str
        What is wrong, with the numbers involved and, where possible, the fix.
    """

    def __init__(self, file: str, where: str, what: str) -> None:
        super().__init__(f"{file}: {where}: {what}")
        self.file = file
        self.where = where
        self.what = what

    def in_file(self, file: str) -> "InputError":
        """The same error attributed to ``file`` (for errors raised before it was known)."""
        return InputError(file, self.where, self.what)

    def line(self) -> str:
        """The one line the CLI prints for this error."""
        return f"error: {self.file}: {self.where}: {self.what}"


class DeadlockError(InputError):
    """A plan whose dependencies form a cycle: some op can never start."""
