#!/usr/bin/env bash
# Room held for the first new job that waits (issue 12; tried, not kept): sim.patch adds a
# setting `reserve_mode` (0: off, as FastServe is; 1: always; m > 1: once the job has waited
# (m - 1) x starve_limit) under which, with no displacement possible (no store room, defer),
# the first new job in the walk that does not fit has its blocks promised for the Step, so
# new jobs ranked below it start only on blocks beyond its need (started jobs still grow).
# Throughput at the SLO of `predictive` without a store, by prediction sigma, both traces,
# Gamma CV 1 and 4; FCFS and the oracle at sigma 0.75. Applies the patch to a worktree of
# BASE in /tmp and runs from there. Prints one line per case. rs_rank.patch (setting
# `rank_power`, for seeds.py) applies on top: git -C /tmp/fastserve-reserve-room apply ...
# Usage: bash docs/bench-predictive/reserve_room/run.sh [MODES]   (from the repository root)
set -euo pipefail
modes=${1:-"0 1 2 4"}
base=${BASE:-237b25a}
root=$(pwd)
out=$root/docs/bench-predictive/reserve_room
tree=/tmp/fastserve-reserve-room
[ -d "$tree" ] || { git worktree add -f "$tree" "$base" >/dev/null; git -C "$tree" apply "$out/sim.patch"; }
cp -r fastserve/proto "$tree/fastserve/" 2>/dev/null || true
source docs/bench-predictive/slo_traces.sh
cd "$tree"
slo() { grep -A4 'req/s at SLO' "$1" | awk -v p="$2" '$1 == p {print $2}'; }
for t in sharegpt azure; do
  for cv in 1 4; do
    for sigma in 0 0.5 0.75 1; do
      line="$t cv$cv sigma$sigma:"
      for m in $modes; do
        log="$out/${t}_cv${cv}_sigma${sigma}_m${m}.txt"
        policies=predictive
        [ "$sigma" = 0.75 ] && policies=fcfs,predictive,srpt-oracle
        # shellcheck disable=SC2086
        PYTHONPATH=$tree "$root/.venv/bin/python" -m fastserve.cli sim --trace "$root/${file[$t]}" \
          ${rate[$t]} --num-requests 1000 --arrivals gamma --cv "$cv" --policies "$policies" \
          --prediction-sigma "$sigma" --prediction-refresh 16 --arrival-probe-error 0 \
          --set "reserve_mode=$m" --slo-search "${grid[$t]}" --refine 2 > "$log" 2>/dev/null
        line="$line m$m $(slo "$log" predictive)"
        [ "$sigma" = 0.75 ] && line="$line (fcfs $(slo "$log" fcfs) oracle $(slo "$log" srpt-oracle))"
      done
      echo "$line"
    done
  done
done
