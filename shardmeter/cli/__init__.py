"""The ``shardmeter`` command line: ``predict``, ``simulate`` and ``plan``."""
