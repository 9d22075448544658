"""The Kueue admission check: every slice of a Workload before Kueue admits it.

``check`` (the controller: reads the Workload and its JobSet, writes the check's state), ``decide``
(the state, from what each slice's pool looks like) and ``pools`` (reads, recycles and creates the
Workload's pools through the instance's engine).
"""
