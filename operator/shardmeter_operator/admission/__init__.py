"""Placement at admission: a mutating (and validating) webhook that rewrites annotated
JobSets from the plan, with the same planner (:func:`~.trainingplan.decide.decide`) and the
same renderer (:func:`~.render.launch.launch_manifests`) a launched TrainingPlan uses, and
records the decision in a TrainingPlan owned by the workload.

* :mod:`.annotations` — the annotations a workload opts in with, parsed (pure);
* :mod:`.placement` — the decision and the mutated object (pure);
* :mod:`.webhook` — kopf's admission handlers and the post-create step (API calls)."""
