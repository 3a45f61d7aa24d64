"""``gmts demo``: all tokens vs ETS vs GMTS under one recipe, from one warm start per seed, over
several RL seeds, compared seed by seed.

The command line is :mod:`gmts.cli.demo`; the demo itself is this package, one job per module:

- ``demo.yaml``: the recipe (a ``gmts train`` config; the one copy, ``configs/demo.yaml`` links
  to it);
- :mod:`~gmts.demo.settings`: the recipe's path, the methods and one invocation's settings;
- :mod:`~gmts.demo.records`: a seed's start, a run's row, the whole result;
- :mod:`~gmts.demo.jobs`: the two jobs, a seed's start (warm start and one evaluation) and one
  method trained from it;
- :mod:`~gmts.demo.progress`: what a running demo keeps and the lines it says;
- :mod:`~gmts.demo.pool`: :func:`~gmts.demo.pool.run_demo`, the jobs here or over spawned
  processes;
- :mod:`~gmts.demo.stats` and :mod:`~gmts.demo.comparisons`: paired differences over seeds;
- :mod:`~gmts.demo.tables`: the printed table; :mod:`~gmts.demo.plot`: ``curves.png``;
  :mod:`~gmts.demo.json_record`: the ``--json`` record.

Import the modules directly (``gmts.demo.pool``); this package imports nothing.
"""
