"""gsplat at the edge: everything that knows gsplat's conventions (render meta, densification statistics, refinement)."""
