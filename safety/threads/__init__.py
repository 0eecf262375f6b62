"""The thread runtime's safety harness: workers, faults, a recording fenced sink, checkers.

Worker processes run :class:`tenure.ThreadRuntime` on one backend and send
signals; handlers write every signal they handle to a shared recording sink
with their run's fencing token. Faults (owner SIGKILL and SIGSTOP, sender
SIGKILL right after a send, a proxy blackhole on one worker's backend
connection, a Redis restart with persistence) are injected, healed, and the
evidence is judged by the pure functions of :mod:`safety.threads.checker`.
Run it with ``python -m safety threads ...`` (see ``SAFETY.md``).
"""
