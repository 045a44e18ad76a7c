"""A launched plan, purely: the state machine and its rules (:mod:`.rules`), which workload
runs the islands — Jobs or one JobSet, queued in Kueue — and how it is followed
(:mod:`.workload`, :mod:`.jobset`), the children of the recorded decision and what creating
them came to (:mod:`.children`), spec drift and the islands' states (:mod:`.follow`).
"""
