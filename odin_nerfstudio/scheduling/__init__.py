"""Ahead of time: SfM tracks, the Relative Locality Graph (RLG) and the per-epoch schedule of steps, with its CLI."""
