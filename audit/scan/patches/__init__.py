"""What the dispatcher never sees: patches installed for one audited step (always restored) that turn host
reads, CUDA waits, stream switches, settings writes, reseeds, hook registrations, module setattrs, collectives,
queue puts and thread hand-offs into events of the trace.
"""
