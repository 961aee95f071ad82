#!/usr/bin/env bash
# Install (if needed) and run the test suite; extra arguments go to pytest.
# By default the tests marked slow (end-to-end training through the CLI, the long equivalence runs) are deselected,
# so that the run stays within minutes on a 2-core machine; --slow runs them too (.ci/run does), -m slow only them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
