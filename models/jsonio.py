"""Reading JSON input with exact error places, and writing files atomically.

The readers below take a decoded JSON value and the path to it, and either return a
value of the right type or raise :class:`~pipeplan.models.errors.InputError` naming the file
and the path.  Only JSON is ever read: no pickles, no eval.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, Mapping

from pipeplan.models.errors import InputError


MAX_INPUT_BYTES = 2**30
"""Largest input file read (1 GiB): a bigger one is refused before any byte is read, so a
mistaken path (a disk image, ``/dev/zero``) never exhausts the memory."""


def load_json(path: str | os.PathLike) -> Any:
    """Decode the JSON file at ``path``.

    Raises
    ------
    InputError
        If the file is not a regular file (see :func:`read_input`), cannot be read or
        is not valid JSON (``NaN`` and ``Infinity`` included: they are not JSON).
    """
    name = str(path)
    try:
        text = read_input(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(name, "file", f"cannot be read: {exc}") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise InputError(name, f"line {exc.lineno} column {exc.colno}", f"invalid JSON: {exc.msg}") from None
    except _DuplicateKey as exc:
        # JSON leaves repeated keys undefined and Python keeps the last: either copy may be the intended one
        raise InputError(name, f"key {exc.args[0]!r}", "appears twice in one object; keep one") from None
    except RecursionError:
        raise InputError(name, "file", "invalid JSON: nested too deeply") from None
    except ValueError as exc:
        raise InputError(name, "file", f"invalid JSON: {exc}") from None
    check_values(value, name)
    return value


_NOT_REGULAR = ((stat.S_ISDIR, "is a directory, not a JSON file"),
                (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file: save the JSON to a file and name that"),
                (stat.S_ISCHR, "is a character device, not a regular file: name a JSON file"),
                (stat.S_ISBLK, "is a block device, not a regular file: name a JSON file"),
                (stat.S_ISSOCK, "is a socket, not a regular file: name a JSON file"))


def _refuse_special(name: str, mode: int) -> None:
    """Raise when ``mode`` is not a regular file's, saying what it is."""
    for test, what in _NOT_REGULAR:
        if test(mode):
            raise InputError(name, "file", what)
    if not stat.S_ISREG(mode):
        raise InputError(name, "file", "is not a regular file: name a JSON file")


def read_input(path: str | os.PathLike) -> bytes:
    """The bytes of the regular file at ``path``, at most :data:`MAX_INPUT_BYTES` of them.

    The file's type is checked with ``os.stat`` before it is opened, so a FIFO never
    blocks ``open()``; it is opened non-blocking and checked again, in case the name
    was swapped between the two.

    Raises
    ------
    InputError
        If there is no such file, it is a directory, FIFO, device or socket, it is
        larger than :data:`MAX_INPUT_BYTES`, or it cannot be read.
    """
    name = str(path)
    try:
        _check_input_stat(name, os.stat(path))
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise InputError(name, "file", "no such file") from None
    except OSError as exc:
        raise InputError(name, "file", f"cannot be read: {exc.strerror or exc}") from None
    try:
        _check_input_stat(name, os.fstat(fd))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputError(name, "file", f"cannot be read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_INPUT_BYTES:  # it grew after the stat
        raise InputError(name, "file", f"is larger than the input limit of {MAX_INPUT_BYTES} bytes")
    return data


def _check_input_stat(name: str, info: os.stat_result) -> None:
    _refuse_special(name, info.st_mode)
    if info.st_size > MAX_INPUT_BYTES:
        raise InputError(name, "file", f"is {info.st_size} bytes, above the input limit of {MAX_INPUT_BYTES} "
                                       f"bytes: no pipeplan file is that large; check the path")


def check_values(value: Any, file: str) -> None:
    """Refuse, at its JSON path, a value that JSON admits but no field can hold.

    Everywhere in the document, unknown fields included: a number beyond the float
    range (``1e999`` decodes to infinity, a 400-digit integer converts to none), and a
    string or key holding an unpaired UTF-16 surrogate (``"\\ud800"``: no Unicode
    character, so it can be neither printed, written as UTF-8 nor drawn).

    Raises
    ------
    InputError
        At the first such value.

    Examples
    --------
    >>> check_values({"a": [1, 2.5, "x"]}, "f.json")
    >>> check_values({"a": [1, float("inf")]}, "f.json")
    Traceback (most recent call last):
    ...
    models.errors.InputError: f.json: a[1]: the number is beyond the float range (magnitude above 1.8e308)
    """
    # (path, value, is_key); children pushed last first, so they are popped in document order
    stack: list[tuple[str, Any, bool]] = [("", value, False)]
    while stack:
        where, item, is_key = stack.pop()
        place = where or "top level"
        if is_key:
            if not _is_unicode(item):
                raise InputError(file, place, f"a key holds {_surrogates(item)}, which is not Unicode text; "
                                              "use real characters")
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.append((f"{where}.{key}" if where else key, child, False))
                stack.append((where, key, True))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", item[i], False) for i in reversed(range(len(item))))
        elif isinstance(item, str) and not _is_unicode(item):
            raise InputError(file, place, f"the string holds {_surrogates(item)}, which is not Unicode text; "
                                          "use real characters")
        elif isinstance(item, float) and not math.isfinite(item):
            raise InputError(file, place, "the number is beyond the float range (magnitude above 1.8e308)")
        elif isinstance(item, int) and not isinstance(item, bool) and not _fits_a_float(item):
            raise InputError(file, place, f"an integer of {len(str(abs(item)))} digits is beyond the float range "
                                          "(magnitude above 1.8e308)")


def _fits_a_float(number: int) -> bool:
    """Whether ``float(number)`` is finite (it rounds to the largest float up to ``2**1024 - 2**970``)."""
    try:
        float(number)
    except OverflowError:
        return False
    return True


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _surrogates(text: str) -> str:
    found = sorted({f"\\u{ord(c):04x}" for c in text if 0xD800 <= ord(c) <= 0xDFFF})
    return f"an unpaired UTF-16 surrogate ({', '.join(found)})"


class _DuplicateKey(Exception):
    """A key repeated within one JSON object (its name is the only argument)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return obj


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def dumps(obj: Any) -> str:
    """Serialise ``obj`` as indented JSON with a trailing newline."""
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename.

    A reader never sees a half-written file, and a failure leaves no file behind.

    Raises
    ------
    InputError
        If the folder does not exist or cannot be written.
    """
    # through a symlink to its file: the rename would otherwise put a file where the link was
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise InputError(str(path), "output", f"cannot write here: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            # mkstemp makes the file private (0600); give it the mode a plain open() would
            os.fchmod(handle.fileno(), 0o666 & ~_umask())
            handle.flush()
            os.fsync(handle.fileno())  # the data is on disk before the name points at it
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    # Reading the umask means setting it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; see :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, text.encode("utf-8"))


class Reader:
    """Typed access to one JSON object, raising :class:`InputError` at the exact place.

    Parameters
    ----------
    obj : Any
        The decoded JSON value that should be an object.
    file : str
        File name for error messages.
    where : str
        JSON path of ``obj`` (``""`` for the top level).

    Examples
    --------
    >>> r = Reader({"speed": 0.5}, "c.json", "devices[0]")
    >>> r.number("speed", positive=True)
    0.5
    """

    def __init__(self, obj: Any, file: str, where: str) -> None:
        if not isinstance(obj, dict):
            raise InputError(file, where or "top level", f"expected a JSON object, got {_kind(obj)}")
        self.obj: dict[str, Any] = obj
        self.file = file
        self.where = where

    def path(self, key: str | int) -> str:
        """The JSON path of ``key`` inside this object (or of item ``key`` of a list)."""
        if isinstance(key, int):
            return f"{self.where}[{key}]"
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str | int, what: str) -> InputError:
        """An :class:`InputError` at ``key``."""
        return InputError(self.file, self.path(key), what)

    def has(self, key: str) -> bool:
        return key in self.obj

    def raw(self, key: str) -> Any:
        if key not in self.obj:
            raise InputError(self.file, self.path(key), "missing required field")
        return self.obj[key]

    def string(self, key: str) -> str:
        value = self.raw(key)
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_kind(value)}")
        return value

    def boolean(self, key: str) -> bool:
        value = self.raw(key)
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {_kind(value)}")
        return value

    def number(self, key: str, *, positive: bool = False) -> float:
        return check_number(self.raw(key), self.file, self.path(key), positive=positive)

    def integer(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
        return check_integer(self.raw(key), self.file, self.path(key), minimum=minimum, maximum=maximum)

    def array(self, key: str, *, nonempty: bool = False) -> list[Any]:
        value = self.raw(key)
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list, got {_kind(value)}")
        if nonempty and not value:
            raise self.fail(key, "must not be empty")
        return value

    def extras(self, known: set[str] | frozenset[str]) -> dict[str, Any]:
        """Fields this reader does not know, kept so that a rewrite preserves them."""
        return {k: v for k, v in self.obj.items() if k not in known}

    def format(self, expected: str, *also: str) -> str:
        """Check the ``format`` field names ``expected`` or one of ``also``; return the one found.

        Examples
        --------
        >>> Reader({"format": "x/2"}, "f", "").format("x/1", "x/2")
        'x/2'
        """
        found = self.string("format")
        accepted = (expected, *also)
        if found in accepted:
            return found
        family = expected.rsplit("/", 1)[0]
        names = " and ".join(repr(a) for a in accepted)
        if found.startswith(family + "/"):
            raise self.fail("format", f"unknown format version {found!r}; this pipeplan reads {names}")
        raise self.fail("format", f"expected {names}, got {found!r}")


def check_number(value: Any, file: str, where: str, *, positive: bool = False) -> float:
    """``value`` as a finite float, >= 0 (or > 0 when ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(file, where, f"expected a number, got {_kind(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer literal beyond the float range
        raise InputError(file, where, f"expected a finite number, got an integer of {len(str(value))} digits") from None
    if not math.isfinite(number):
        raise InputError(file, where, f"expected a finite number, got {value!r}")
    if positive and number <= 0:
        raise InputError(file, where, f"must be positive, got {value!r}")
    if number < 0:
        raise InputError(file, where, f"must not be negative, got {value!r}")
    return number


MAX_EXACT_INT = 2**53
"""Largest integer every count and index may take: beyond it floats no longer hold integers exactly."""


def check_integer(value: Any, file: str, where: str, *, minimum: int | None = None,
                  maximum: int | None = None) -> int:
    """``value`` as an int (a float with an integral value is refused: it is a typo)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(file, where, f"expected an integer, got {_kind(value)}")
    if minimum is not None and value < minimum:
        raise InputError(file, where, f"must be at least {minimum}, got {_short(value)}")
    if maximum is not None and value > maximum:
        raise InputError(file, where, f"must be at most {maximum}, got {_short(value)}")
    return value


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"an integer of {len(text)} digits"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value!r}" if len(value) <= 40 else "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def number_list(value: Any, file: str, where: str, length: int) -> tuple[float, ...]:
    """``value`` as a list of exactly ``length`` non-negative finite numbers."""
    if not isinstance(value, list):
        raise InputError(file, where, f"expected a list of {length} numbers, got {_kind(value)}")
    if len(value) != length:
        raise InputError(file, where, f"expected {length} numbers, got {len(value)}")
    return tuple(check_number(v, file, f"{where}[{i}]") for i, v in enumerate(value))


def check_writable(*paths: str | os.PathLike | None, inputs: dict[str, str | None] | None = None,
                   force: bool = False) -> None:
    """Check, before any work, that every output path given can be written.

    Commands call this first so that a bad output path fails before anything is
    computed or written (and so never leaves some outputs written and others not).
    ``inputs`` (``role -> path``, e.g. ``{"graph": ...}``) are the files the command
    reads: an output that is one of them (the same file, under any name) would replace it.
    An output must be a regular file or a new name (see :func:`check_output_kind`); an
    existing read-only file is replaced only when ``force``.

    Raises
    ------
    InputError
        Naming the first path whose folder is missing or not writable, that is an input,
        that names the same file as an earlier output (the later write would replace it),
        that is a device, FIFO, socket or dangling symlink, or (without ``force``) a
        read-only file.
    """
    given = [path for path in paths if path is not None]
    for k, path in enumerate(given):
        if str(path).endswith(("/", os.sep)):
            raise InputError(str(path), "output", "ends in a slash: name a file, not a folder")
        folder = Path(path).parent if str(Path(path).parent) else Path(".")
        if folder.exists() and not folder.is_dir():
            raise InputError(str(path), "output", f"{str(folder)!r} is a file, not a folder")
        if not folder.is_dir():
            raise InputError(str(path), "output", f"folder {str(folder)!r} does not exist")
        for earlier in given[:k]:
            if _same_output(path, earlier):
                raise InputError(str(path), "output", f"is also the file of another output ({earlier}); "
                                                      f"one would replace the other: name another file")
        if not os.access(folder, os.W_OK):
            raise InputError(str(path), "output", f"folder {str(folder)!r} is not writable")
        if Path(path).is_dir():
            raise InputError(str(path), "output", "is a folder, not a file name")
        check_output_kind(path, force=force)
        for role, source in (inputs or {}).items():
            if source is not None and _same_file(path, source):
                raise InputError(str(path), "output", f"is the {role} file {source}; writing it would replace "
                                                      f"the input: name another file")


def check_output_kind(path: str | os.PathLike, *, force: bool = False) -> None:
    """Refuse an output name that the atomic rename would wrongly replace.

    The rename puts a new regular file where the name was: over a device (``/dev/null``
    for everyone), a FIFO or a socket that would be wrong, over a dangling symlink it
    would replace the link, and over a read-only file it would override the owner's
    protection (``force`` allows that).  A symlink to a regular file is written
    through (see :func:`atomic_write_bytes`).

    Raises
    ------
    InputError
        For a device, FIFO, socket or dangling symlink, or a read-only file without ``force``.
    """
    name = str(path)
    if not os.path.lexists(path):
        return
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(name, "output", f"is a symlink to {os.readlink(path)!r}, which does not exist: "
                                         f"name the file itself or a new path") from None
    if not stat.S_ISREG(info.st_mode):
        kind = next((what.split(",")[0] for test, what in _NOT_REGULAR if test(info.st_mode)), "is not a regular file")
        raise InputError(name, "output", f"{kind}; an output must be a regular file or a new path")
    # the mode bits, not os.access: as root, access() calls every file writable
    if not force and not info.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise InputError(name, "output", "is a read-only file: pass --force to replace it, or name another file")


def _same_output(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether outputs ``a`` and ``b`` would be one file (they need not exist yet)."""
    return Path(a).resolve() == Path(b).resolve() or _same_file(a, b)


def _same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` both exist and are one file."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
