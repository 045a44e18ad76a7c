"""TrainingPlans, read → decide → apply.

* :mod:`.reconcile` — the acting half: reads what the decision needs, runs it (in the
  planning worker when it searches), writes the launch decision before any child exists,
  creates the children, observes the running islands;
* :mod:`.decide` — the decision, purely, from :class:`~shardmeter_operator.decision.PlanInputs`
  to :class:`~shardmeter_operator.decision.PlanResult`: validation (:mod:`.validate`), the
  search and the launch record (:mod:`.planned`, over the model: :mod:`.model`), and a
  launched plan's decision (:mod:`.launched`, using :mod:`shardmeter_operator.launch`).
"""
