"""The repository's folder imported as the package ``pipeplan``.

Python started in the folder that holds a clone named ``pipeplan`` finds the clone
before the installed package; without this file it would import the clone as an
empty namespace package.  It loads the real package, ``pipeplan/pipeplan``, and
gives it the layout's folders as sub-packages (``pipeplan.models`` is ``models/``),
as the install maps them (pyproject.toml's ``package-dir``).  Not part of the
install: the wheel holds ``pipeplan/__init__.py`` itself.
"""

from pathlib import Path as _Path

_ROOT = _Path(__file__).resolve().parent
__path__ = [str(_ROOT / "pipeplan"), str(_ROOT)]
_INIT = _ROOT / "pipeplan" / "__init__.py"
exec(compile(_INIT.read_text(), str(_INIT), "exec"))  # noqa: S102 (the package's own source)
