"""Agent frameworks on tenure: thin users of the runtime and of :mod:`tenure.fencing`."""
