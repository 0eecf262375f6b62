"""Thread names: ``(namespace, thread_key)`` → one lease key and topic, injectively.

The name is ``<escaped namespace>:<thread key>``, where the namespace has ``%``,
``:`` and ``#`` percent-escaped. The first ``:`` of a name therefore ends the
namespace, so two different pairs never share a name (``("app", "v2:42")`` and
``("app:v2", "42")`` map to ``app:v2:42`` and ``app%3Av2:42``), and the thread
key is read back from a name by splitting there. A thread's *control* topic
(interrupts) is ``<escaped namespace>#i:<thread key>``: never a thread's name.
"""

from __future__ import annotations

from .._errors import InvalidArgument
from .._validate import MAX_NAME_BYTES, check_name

__all__ = ["ThreadNames", "escape_namespace"]


def escape_namespace(namespace: str) -> str:
    return namespace.replace("%", "%25").replace(":", "%3A").replace("#", "%23")


class ThreadNames:
    """The names of one namespace's threads."""

    __slots__ = ("_budget", "_control", "namespace", "prefix")

    def __init__(self, namespace: str) -> None:
        self.namespace = check_name(namespace, "namespace")
        #: Every name of the namespace starts with it (and no other namespace's does).
        escaped = escape_namespace(namespace)
        self.prefix = escaped + ":"
        self._control = escaped + "#i:"
        self._budget = MAX_NAME_BYTES - len(self._control.encode("utf-8"))
        if self._budget < 1:
            raise InvalidArgument(
                f"namespace must leave room for thread keys: at most {MAX_NAME_BYTES - 2} "
                "bytes in UTF-8 once escaped"
            )

    def name(self, thread_key: str) -> str:
        """The lease key and topic of ``thread_key``; raises ``InvalidArgument`` for a bad key."""
        check_name(thread_key, "thread_key")
        size = len(thread_key.encode("utf-8"))
        if size > self._budget:
            raise InvalidArgument(
                f"thread_key must be at most {self._budget} bytes in UTF-8 in namespace "
                f"{self.namespace!r} (its topics are the namespace, a separator and the thread "
                f"key, at most {MAX_NAME_BYTES} bytes), got {size}"
            )
        return self.prefix + thread_key

    def control(self, thread_key: str) -> str:
        """The topic on which senders ask the owner of ``thread_key`` to interrupt its run."""
        self.name(thread_key)
        return self._control + thread_key

    def cancel(self, thread_key: str) -> str:
        """The topic on which a cancel of ``thread_key``'s run reaches its owner (replies)."""
        self.name(thread_key)
        return self._control[: -len("#i:")] + "#c:" + thread_key

    def thread_of(self, name: str) -> str | None:
        """The thread key whose name is ``name``, or ``None`` if it is not of this namespace."""
        if not name.startswith(self.prefix) or len(name) == len(self.prefix):
            return None
        return name[len(self.prefix) :]
