"""Candidate sets C(t): bounding spheres of the Gaussians, their block index, and the regions a task culls against."""
