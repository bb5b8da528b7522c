# Sourced by the before-and-after timings here (steady.sh, passing/run.sh): their arguments
# BEFORE_DIR (a checkout of the commit before the change, its generated protos copied in)
# and N (requests), the project's interpreter and the Azure conversation trace.
set -euo pipefail
before=${1:-/tmp/before}
n=${2:-50000}
here=$(pwd)
py=$here/.venv/bin/python
trace=$here/../shared/traces/AzureLLMInferenceTrace_conv.csv
