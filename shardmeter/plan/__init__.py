"""Deployment optimizer (paper §III-D, §V): island layouts, batch apportioning, Streaming
DiLoCo settings, the cost/runtime Pareto frontier and objectives (reported by
``shardmeter.output``)."""
