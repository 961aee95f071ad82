"""The one rasterization call (gsplat's signature) and its pure-torch CPU twin."""
