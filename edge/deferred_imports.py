"""Standard-library modules the agent's MQTT client imports and an idle agent never uses,
loaded on their first use instead.

paho-mqtt imports `urllib.request` at the top of its client module for one thing: reading
an `mqtt_proxy` environment variable, which it does only where PySocks is installed (no
`greenfed[edge]` install has it). `urllib.request` brings `http.client`, `email` and
`tempfile` with it: about 1.4 MB resident in an agent that runs for months
(benchmarks/RESULTS.md, issue 28).

Five more are imported at the top of a module that uses them only inside a function an
idle agent does not call: `ipaddress` (`urllib.parse`, which `pathlib` imports: a URL whose
host is in brackets), `stringprep` (the `idna` codec, which `socket.getaddrinfo` looks up
for every host name: a name that is not ASCII), `locale` (`subprocess`: a pipe opened as
text without an encoding), `textwrap` (msgspec's JSON Schema, traceback's exception
groups) and `tokenize` (linecache and inspect: a traceback's source lines). About 0.5 MB
between them, from source; `python -m greenfed edge run` (greenfed/__main__.py) defers
them before anything imports them.

A deferred module is a stand-in in `sys.modules` that imports the real module on the
first attribute anyone asks of it, and then hands every attribute over; whoever imports
the module after that gets the real one. `importlib.util.LazyLoader` cannot do this here:
an `import` statement reads the module's `__spec__` to see whether it is still
initialising, and that read alone makes a lazy module load.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Final

AGENT_DEFERRED_MODULES: Final = (
    "urllib.request",  # paho-mqtt's proxy lookup (and with it http.client, email, tempfile)
    "ipaddress",  # urllib.parse's check of a bracketed (IPv6) host
    "stringprep",  # the idna codec's nameprep, for host names that are not ASCII
    "locale",  # subprocess's default text encoding, for pipes opened as text
    "textwrap",  # msgspec's JSON Schema docs, traceback's exception groups
    "tokenize",  # linecache's source lines for a traceback, inspect's source reading
)

_swapping = threading.Lock()


def defer_imports(names: tuple[str, ...] = AGENT_DEFERRED_MODULES) -> None:
    """Stand-ins for `names` that import each on its first use; a module already
    imported, or not found, is left as it is."""
    for name in names:
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None:
            continue
        stand_in = _DeferredModule(name)
        # An `import` statement finds this spec, sees it is not initialising, and returns
        # the stand-in without touching anything else.
        stand_in.__spec__ = spec
        sys.modules[name] = stand_in
        parent, _, child = name.rpartition(".")
        if parent:
            # `import urllib.request` binds `urllib`; `urllib.request` is then this.
            setattr(sys.modules[parent], child, stand_in)


class _DeferredModule(ModuleType):
    """A module's stand-in until its first use (attributes it has of its own, such as
    `__name__` and `__spec__`, are answered without importing anything)."""

    def __getattr__(self, attribute: str) -> object:
        return getattr(self._real_module(), attribute)

    def _real_module(self) -> ModuleType:
        name = self.__name__
        with _swapping:  # two threads at once: only a stand-in is taken out, never the module
            if sys.modules.get(name) is self:
                del sys.modules[name]
        # The import system loads it once (its own lock) and binds it in its parent.
        return importlib.import_module(name)
