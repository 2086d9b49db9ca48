"""Why two steps ran different code: the decision behind a branch (a host counter, a loop's own
element, a key test, a raising check), and the differences that are no decision at all.
"""
