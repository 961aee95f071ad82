"""Odin's runtime: the three hooks (before_read, after_backward, publish) over parts that each own one job."""
