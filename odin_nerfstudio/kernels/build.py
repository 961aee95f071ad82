"""Build Odin's compiled kernels into the cache now (``python -m odin_nerfstudio.kernels.build [--cuda]``).

scripts/setup.sh runs it so that a fresh install has the CPU ops built; prints the folder and the build time.
"""

from __future__ import annotations

import argparse
import time

from odin_nerfstudio.kernels import _backend


def main() -> None:
    """Build the CPU flavour (or, with --cuda, the CUDA one), verbose on request."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cuda", action="store_true", help="build the CUDA flavour (needs nvcc and CUDA torch)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    flavour = "cuda" if args.cuda else "cpu"
    start = time.perf_counter()
    folder = _backend.build(flavour, verbose=args.verbose)
    print(f"odin kernels: {flavour} ops ready in {folder} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
