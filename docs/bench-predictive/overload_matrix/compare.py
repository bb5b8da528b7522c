"""Before and after, as a markdown table: each pair's tokens/s over FCFS's with the same KV
policy, on every trace and rate `traces.sh` ran; bold under 0.95x.

    python docs/bench-predictive/overload_matrix/compare.py BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import json
import pathlib
import sys

COLUMNS = [("sharegpt_lengths_llama2-1.3", "ShareGPT 1.5x"), ("sharegpt_lengths_llama2-2.6",
           "ShareGPT 3x"), ("AzureLLMInferenceTrace_code-3.9", "code 1.5x"),
           ("AzureLLMInferenceTrace_code-7.8", "code 3x"), ("AzureLLMInferenceTrace_conv-2.7",
           "conv 1.5x"), ("AzureLLMInferenceTrace_conv-5.4", "conv 3x")]


def ratios(directory: str, stem: str) -> dict[tuple[str, str], float]:
    runs = {(r["policy"], r["kv_policy"]): r["throughput_tokens_s"]
            for r in json.loads((pathlib.Path(directory) / f"{stem}.json").read_text())}
    return {k: v / runs[("fcfs", k[1])] for k, v in runs.items() if k[0] != "fcfs"}


def cell(x: float) -> str:
    return f"**{x:.3f}**" if x < 0.95 else f"{x:.3f}"


def main() -> None:
    before = {stem: ratios(sys.argv[1], stem) for stem, _ in COLUMNS}
    after = {stem: ratios(sys.argv[2], stem) for stem, _ in COLUMNS}
    print("| policy + KV policy | " + " | ".join(name for _, name in COLUMNS) + " |")
    print("|---|" + "---:|" * len(COLUMNS))
    for pair in after[COLUMNS[0][0]]:
        cells = []
        for stem, _ in COLUMNS:
            b, a = before[stem][pair], after[stem][pair]
            cells.append(cell(a) if round(a, 3) == round(b, 3) else f"{cell(b)} -> {cell(a)}")
        print(f"| {pair[0]} + {pair[1]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
