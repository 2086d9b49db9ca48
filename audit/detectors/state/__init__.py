"""Python state a step changes: which statement changed it, on which object, and the line of the
target's own code that led there (library objects, hooks, threads, queues, held objects).
"""
