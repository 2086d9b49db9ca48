"""Where a varying shape or a moving address starts: the origin a finding names, and the tensors
downstream of it (sizes read off a varying tensor, reads of escaped allocations) that repeat it.
"""
