"""``tenure demo``: several worker processes, one thread runtime, a kill, and a verdict.

- :mod:`tenure.demo._run`: the coordinator (:func:`run_demo`);
- :mod:`tenure.demo.worker`: one worker process, ``python -m tenure.demo.worker DIR INDEX``;
- :mod:`tenure.demo._evidence`: what the processes record, and the verdict;
- :mod:`tenure.demo._view`: the live view built from those records.

The demo reaches a backend only through :func:`tenure.from_url` and the thread
runtime. It needs the ``demo`` extra (``rich``): ``pip install 'tenure[demo]'``.
"""

from ._run import DemoSettings, run_demo

__all__ = ["DemoSettings", "run_demo"]
