"""Data-sheet figures ("200 Gb/s each way", "600 GB/s bidirectional", "312 TFLOPS", "80 GiB",
"5 us") turned into the cluster format's units: bytes, bytes per second one way, FLOP/s, seconds.

Every figure of the catalog goes through :func:`parse_figure`, so the two classic slips,
bits for bytes and a both-ways total for a one-way rate, are handled here and only here:

- ``b`` is a bit and ``B`` a byte (``Gb/s`` = 1e9 bits/s = 1.25e8 bytes/s);
- a link rate must say its direction: ``each way`` (also ``one-way``, ``per direction``)
  or ``bidirectional`` (the sum of both directions, halved here);
- decimal prefixes (k, M, G, T, P) are powers of 1000; binary ones (Ki, Mi, Gi, Ti) of 1024.
"""

from __future__ import annotations

import re

from pipeplan.models.errors import InputError

PREFIXES = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
            "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}
"""Multipliers of the unit prefixes."""

EACH_WAY = ("each way", "one-way", "one way", "per direction")
"""Words saying a link rate is that of one direction."""
BOTH_WAYS = ("bidirectional", "both ways")
"""Words saying a link rate is the sum of both directions."""

TIME_UNITS = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}
"""Time units per second (dividing by it gives ``5 us`` as exactly ``5e-06``)."""

_FIGURE = re.compile(r"^\s*(?P<number>[0-9][0-9,]*(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z/]+)\s*(?P<rest>.*?)\s*$")
_RATE = re.compile(r"^(?P<prefix>Ki|Mi|Gi|Ti|[kKMGTP]?)(?P<size>[bB])/s$")
_SIZE = re.compile(r"^(?P<prefix>Ki|Mi|Gi|Ti|[kKMGTP]?)B$")
_FLOPS = re.compile(r"^(?P<prefix>[kKMGTP]?)FLOPS$")

KINDS = ("link", "memory-bandwidth", "bytes", "flops", "seconds")
"""What a figure measures; :func:`parse_figure` checks the unit fits it."""


def parse_figure(text: str, kind: str, where: str = "figure") -> float:
    """The value of a data-sheet figure in the cluster format's unit for ``kind``.

    Parameters
    ----------
    text : str
        The figure, a number (thousands commas allowed) and a unit: ``"200 Gb/s each way"``,
        ``"600 GB/s bidirectional"``, ``"2,039 GB/s"``, ``"80 GiB"``, ``"312 TFLOPS"``, ``"5 us"``.
    kind : str
        One of :data:`KINDS`: ``link`` (bytes per second one way; a direction word is
        required), ``memory-bandwidth`` (bytes per second, no direction), ``bytes``,
        ``flops`` (FLOP per second) or ``seconds``.
    where : str
        Where the figure comes from, for the error message.

    Returns
    -------
    float

    Raises
    ------
    InputError
        If the text is not a number and a unit of that kind, or a link rate does not say
        its direction.

    Examples
    --------
    >>> parse_figure("200 Gb/s each way", "link")
    25000000000.0
    >>> parse_figure("600 GB/s bidirectional", "link")
    300000000000.0
    >>> parse_figure("80 GiB", "bytes") == 80 * 2**30
    True
    """
    if kind not in KINDS:
        raise ValueError(f"unknown figure kind {kind!r}; kinds are {KINDS}")
    match = _FIGURE.match(text)
    if match is None:
        raise InputError("-", where, f"expected a number and a unit such as '200 Gb/s each way', got {text!r}")
    number = float(match["number"].replace(",", ""))
    unit, rest = match["unit"], match["rest"].lower()
    if kind == "seconds":
        if unit not in TIME_UNITS or rest:
            raise InputError("-", where, f"expected a time in {', '.join(TIME_UNITS)}, got {text!r}")
        return number / TIME_UNITS[unit]
    if kind == "flops":
        flops = _FLOPS.match(unit)
        if flops is None or rest:
            raise InputError("-", where, f"expected FLOP/s such as '312 TFLOPS', got {text!r}")
        return number * PREFIXES[flops["prefix"]]
    if kind == "bytes":
        size = _SIZE.match(unit)
        if size is None or rest:
            raise InputError("-", where, f"expected a size in bytes such as '80 GiB', got {text!r}")
        return number * PREFIXES[size["prefix"]]
    rate = _RATE.match(unit)
    if rate is None:
        raise InputError("-", where, f"expected a rate such as '25 GB/s' or '200 Gb/s', got {text!r}")
    bytes_per_second = number * PREFIXES[rate["prefix"]] / (8.0 if rate["size"] == "b" else 1.0)
    if kind == "memory-bandwidth":
        if rest:
            raise InputError("-", where, f"a memory bandwidth has no direction, got {text!r}")
        return bytes_per_second
    if rest in EACH_WAY:
        return bytes_per_second
    if rest in BOTH_WAYS:
        return bytes_per_second / 2.0
    raise InputError("-", where, f"a link rate must say its direction ({EACH_WAY[0]!r} or {BOTH_WAYS[0]!r}), "
                                 f"got {text!r}")
