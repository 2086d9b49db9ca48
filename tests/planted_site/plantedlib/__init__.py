"""A small third-party package with CUDA-graph hazards inside it, for the library-frame tests.

The tests copy it into a temporary site directory (as `pip install --target` would) and scan a
target in tests/planted/ that calls into it: every finding must name the line here, in the copy
that was imported, with the target's own line that led there as its caller. Hazard lines carry
`# HAZARD: <category>` markers like the planted targets.
"""
