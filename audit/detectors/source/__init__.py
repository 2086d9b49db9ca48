"""What the target's source says: the statement that chose, scopes, assignment targets, the
places a name is mutated, what a call reaches by name. Rules ask these when the trace alone
cannot put a hazard on the line that decides it.
"""
