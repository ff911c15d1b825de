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
        """The one line the CLI prints for this error (control characters escaped, so it stays one).

        Examples
        --------
        >>> InputError("a\\nb.json", "file", "no such file").line()
        'error: a\\\\nb.json: file: no such file'
        """
        return one_line(f"error: {self.file}: {self.where}: {self.what}")


def one_line(text: str) -> str:
    """``text`` with control characters (newlines, tabs, escape sequences) written as escapes.

    A file name may hold any of them; printed raw, a newline would break the CLI's
    one-line errors and an escape sequence would reach the terminal.
    """
    return "".join(repr(c)[1:-1] if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 else c for c in text)


class DeadlockError(InputError):
    """A plan whose dependencies form a cycle: some op can never start."""
