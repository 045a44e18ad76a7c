"""GPUPools, read → decide → apply: :mod:`.reconcile` reads the pool's coefficients ConfigMap
and benchmark Job and applies the decision; :mod:`.decide` decides the whole status purely
(the benchmark state machine, the coefficients plans use); :mod:`.correction` merges the step
samples launched plans observed on the pool into its observed correction.
"""
