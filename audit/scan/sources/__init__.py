"""Which code is whose and which line ran: user files vs libraries, generated and compiled frames mapped back to
source, the modules a step ran in, and the flags and lines read from parsed source without running it.
"""
