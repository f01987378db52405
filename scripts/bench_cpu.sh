#!/usr/bin/env bash
# CPU benchmark: d12, B=4, T=64, one rank, 2 threads. Reports the mean over steps 3.. (the first
# steps touch fresh memory), then per ZeRO stage on 2 ranks (1 thread each) a tiny model's
# throughput and bytes per rank. d12 also with --offload cpu, and ZeRO-Offload's host AdamW
# against the machine's copy bandwidth.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
STEPS=${STEPS:-8}
mean_ms() { grep -E '^step' | awk -F'|' 'NR>2 { sub(/ ms/, "", $5); s += $5; n++ } END { printf "%.1f", s / n }'; }

for offload in none cpu; do
    out=$(OMP_NUM_THREADS=2 mpirun -np 1 --bind-to none ./train_gpt -e d12 -b 4 -t 64 -x "$STEPS" -v 0 -s 0 -o "" --offload "$offload")
    ms=$(echo "$out" | mean_ms)
    echo "cpu d12 B=4 T=64, 1 rank x 2 threads, --offload $offload: $ms ms/step, $(awk -v m="$ms" 'BEGIN { printf "%.0f", 256 / m * 1000 }') tok/s | $(echo "$out" | grep '^rank 0 memory')"
done

for n in 2 4; do
    base=""
    for z in 0 1 2 3; do
        out=$(OMP_NUM_THREADS=1 mpirun -np "$n" --oversubscribe ./train_gpt -e d6 -b 2 -t 64 -x "$STEPS" -v 0 -s 0 -o "" -z "$z")
        ms=$(echo "$out" | mean_ms)
        [ -z "$base" ] && base=$ms
        mem=$(echo "$out" | grep '^rank 0 memory' | sed 's/rank 0 memory MiB: //')
        echo "cpu d6 B=2 T=64, $n ranks, ZeRO $z: $ms ms/step ($(awk -v a="$base" -v b="$ms" 'BEGIN { printf "%.2f", a / b }')x stage 0's throughput) | rank 0 MiB: $mem"
    done
done

scripts/bench_host_adamw
