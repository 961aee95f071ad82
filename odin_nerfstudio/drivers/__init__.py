"""Drivers of the runtime: the step loop a trainer calls, and virtual workers in a chosen interleaving."""
