#!/usr/bin/env bash
# The paper's CIFAR-100 experiments as commands: main table (F2M, Baseline), ablation table (FM, PF,
# PC, PN), bound table (b), flatness table; then one report.
#
#   experiments/cifar100.sh full OUT          # full protocol (TFDS cifar100, 30,003 iterations): a GPU
#   experiments/cifar100.sh trainsplit OUT    # offline real data ($F2M_DATA_DIR), 3,000 iterations
#   STEPS=300 DRAWS=100 experiments/cifar100.sh trainsplit OUT   # a reduced budget for a CPU
#
# Rows that share a base model reuse its checkpoint (--checkpoint) instead of retraining it.
# Workdirs are resumable: rerunning the script continues where it stopped.
set -euo pipefail
variant=${1:?usage: experiments/cifar100.sh full|trainsplit OUT}
out=${2:?usage: experiments/cifar100.sh full|trainsplit OUT}
cfg=configs/cifar100.py
[ "$variant" = full ] || cfg="$cfg:$variant"
extra=()
if [ -n "${STEPS:-}" ]; then
  extra+=(--config.base.steps="$STEPS" --config.base.milestones="($((STEPS / 2)),)")
fi
[ -n "${RUNS:-}" ] && extra+=(--config.runs="$RUNS")

run() {  # run NAME [overrides...]
  local name=$1; shift
  echo "=== $name"
  python run.py --config "$cfg" --workdir "$out/$name" "${extra[@]}" "$@"
}

# Main table.
run f2m
run baseline --config.method=baseline
# Ablation table, one row each (FM PF PC PN); the first two rows share a base model without noise.
run abl_none --config.noise.enabled=False --config.noise.prototype_fixing=False \
    --config.incremental.clamp=False --config.eval.normalize_prototypes=False
run abl_pc --checkpoint "$out/abl_none" --config.noise.enabled=False --config.noise.prototype_fixing=False \
    --config.eval.normalize_prototypes=False
run abl_no_pc --checkpoint "$out/f2m" --config.incremental.clamp=False
run abl_no_pf --config.noise.prototype_fixing=False
run abl_no_pn --checkpoint "$out/f2m" --config.eval.normalize_prototypes=False
# Bound table: the paper's b (its code's config value) is twice our half-width noise.bound.
for b in 0.00125 0.0025 0.01 0.02 0.04; do
  run "bound_$b" --config.noise.bound="$b"
done
# Flatness table (N = 1000 draws unless DRAWS is set).
for name in f2m baseline; do
  method=f2m; [ "$name" = baseline ] && method=baseline
  run "$name" --mode flatness --config.method="$method" --config.flatness.num_draws="${DRAWS:-1000}"
done

python -m f2m_jax.report "$out/f2m" "$out/baseline" --labels F2M,Baseline --reference 1 --out "$out/report_main"
python -m f2m_jax.report "$out/abl_none" "$out/abl_pc" "$out/abl_no_pc" "$out/abl_no_pf" "$out/abl_no_pn" "$out/f2m" \
    --labels "-,PC,FM+PF+PN,FM+PC+PN,FM+PF+PC,FM+PF+PC+PN" --reference 5 --out "$out/report_ablation"
python -m f2m_jax.report "$out"/bound_0.00125 "$out"/bound_0.0025 "$out/f2m" "$out"/bound_0.01 "$out"/bound_0.02 \
    "$out"/bound_0.04 --labels "b=0.0025,b=0.005,b=0.01,b=0.02,b=0.04,b=0.08" --reference 2 --out "$out/report_bound"
