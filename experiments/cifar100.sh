#!/usr/bin/env bash
# The paper's CIFAR-100 experiments as commands: main table (F2M, Baseline), ablation table (FM, PF,
# PC, PN), bound table (b), flatness table, and the fidelity table (each behaviour of the authors'
# code switched back to the paper's definition, one at a time); then one report per table.
#
#   experiments/cifar100.sh full OUT          # full protocol (TFDS cifar100, 30,003 iterations): a GPU
#   experiments/cifar100.sh trainsplit OUT    # offline real data ($F2M_DATA_DIR), 3,000 iterations
#   STEPS=600 DRAWS=250 FLAT_IMAGES=2000 experiments/cifar100.sh trainsplit OUT   # a budget for a CPU
#   STEPS=30 RUNS=2 experiments/cifar100.sh smoke OUT   # synthetic data: checks the script in minutes
#
# STEPS: base iterations (learning rate x lr_gamma at STEPS/2); RUNS: draws of the shots; DRAWS and
# FLAT_IMAGES: noise draws and images per set of the flatness table (default 1000 and all images);
# SPLITS: which superclass splits (default "superclass1 superclass2"); OVERRIDES: more --config.*
# flags for every run (e.g. a shorter cRT schedule, below);
# TABLES: which tables (default "main ablation bound flatness fidelity upper superclass"; every
# table needs main). upper: joint training and cRT beside F2M and the Baseline, the gap column taken
# against cRT; superclass: the four methods on the paper's two superclass splits; compared: the
# paper's compared methods (FSLL on the Baseline's base model, iCaRL and Rebalance on their own) and,
# on real data, the appendix's check of iCaRL and Rebalance in plain class-incremental learning
# (configs/cifar100_incremental.py: 50 base classes + 5 sessions of 10, 20 exemplars per class).
# On 2 CPU cores (2026-11) a 600-iteration F2M base session takes about 35 minutes, its 10 x 8
# sessions about 5. Joint training is the costly row (a network per session and run); the budget
# measured on the CPU for the superclass splits (experiments/results section 11), one split per core,
# about 2 hours each with other work on the machine:
#   TABLES=superclass SPLITS=superclass1 STEPS=100 RUNS=2 \
#     OVERRIDES="--config.crt.epochs=2 --config.crt.milestones=(1,)" experiments/cifar100.sh trainsplit OUT
# On the main split the upper table at that budget took joint 58 minutes for one draw (1 + 8 networks)
# and cRT 28 (section 12; experiments/results/cpu_100_upper/commands.sh ran it with RUNS=1 for both).
#
# Rows that share a base model reuse its checkpoint (--checkpoint) instead of retraining it.
# Workdirs are resumable: rerunning the script continues where it stopped.
set -euo pipefail
variant=${1:?usage: experiments/cifar100.sh full|trainsplit|smoke OUT}
out=${2:?usage: experiments/cifar100.sh full|trainsplit|smoke OUT}
cfg=configs/cifar100.py
[ "$variant" = full ] || cfg="$cfg:$variant"
extra=()
if [ -n "${STEPS:-}" ]; then
  extra+=(--config.base.steps="$STEPS" --config.base.milestones="($((STEPS / 2)),)")
fi
[ -n "${RUNS:-}" ] && extra+=(--config.runs="$RUNS")
read -r -a more <<< "${OVERRIDES:-}"
extra+=(${more[@]+"${more[@]}"})
tables=" ${TABLES:-main ablation bound flatness fidelity upper superclass compared} "
[ "$variant" = smoke ] && tables=${tables/ superclass / }  # the splits need real CIFAR-100 classes
want() { [[ "$tables" == *" $1 "* ]]; }

run() {  # run NAME [overrides...]
  local name=$1; shift
  echo "=== $name"
  python run.py --config "$cfg" --workdir "$out/$name" "${extra[@]}" "$@"
}

# Main table (F2M's run is the base model of most other tables; the superclass table alone skips it).
[ "${tables// /}" = superclass ] || run f2m
want main && run baseline --config.method=baseline
# Fidelity table: from the defaults (the authors' code), one behaviour back to the paper at a time,
# then all of them at once (the paper-literal F2M).
if want fidelity; then
  run fid_unrounded --checkpoint "$out/f2m" --config.incremental.round_steps=False
  run fid_bn_clean --config.noise.bn_updates=clean
  run fid_gamma0 --config.noise.std_weight=0
  run fid_pf_grad --config.noise.pf_gradient=True
  run fid_uniform --config.noise.distribution=uniform
  # the authors' code on PyTorch >= 1.10 (the default is the paper's runs': the noisy-weight gradient)
  run fid_clean_backward --config.noise.backward_weights=clean
  run fid_balanced --config.base.sampler=balanced
  run fid_paper --config.noise.bn_updates=clean --config.noise.std_weight=0 --config.noise.pf_gradient=True \
      --config.noise.distribution=uniform --config.base.sampler=balanced \
      --config.incremental.round_steps=False
fi
# Upper bound (the paper's joint and cRT rows): one network per session and run, then cRT on them.
if want upper; then
  run joint --config.method=joint
  run crt --config.method=crt --checkpoint "$out/joint"
fi
# The paper's compared methods as the authors ran them: FSLL on the Baseline's base model, iCaRL and
# Rebalance on their own (a bias-free linear and a cosine classifier).
if want compared; then
  run icarl --config.method=icarl  # its own base (bias-free classifier)
  run fsll --config.method=fsll --checkpoint "$out/baseline"
  run rebalance --config.method=rebalance  # its own base (cosine classifier)
  if [ "$variant" != smoke ]; then
    ci=configs/cifar100_incremental.py; [ "$variant" = full ] || ci="$ci:$variant"
    for m in icarl rebalance; do
      echo "=== ci_$m"
      python run.py --config "$ci" --workdir "$out/ci_$m" "${extra[@]}" --config.method=$m
    done
  fi
fi
# The paper's appendix class splits by superclass: the four methods on each.
if want superclass; then
  for split in ${SPLITS:-superclass1 superclass2}; do
    run "${split}_f2m" --config.data.split=$split
    run "${split}_baseline" --config.data.split=$split --config.method=baseline
    run "${split}_joint" --config.data.split=$split --config.method=joint
    run "${split}_crt" --config.data.split=$split --config.method=crt --checkpoint "$out/${split}_joint"
  done
fi
if want ablation; then
# Ablation table, one row each (FM PF PC PN). The rows without FM fine-tune the Baseline's base model
# (plain CE, shuffled batches); the others reuse F2M's, except the row without PF, which trains its own.
ce=(--config.noise.enabled=False --config.noise.prototype_fixing=False --config.base.sampler=shuffle)
run abl_none --checkpoint "$out/baseline" "${ce[@]}" --config.incremental.clamp=False \
    --config.eval.normalize_prototypes=False
run abl_pc --checkpoint "$out/baseline" "${ce[@]}" --config.eval.normalize_prototypes=False
run abl_no_pc --checkpoint "$out/f2m" --config.incremental.clamp=False
run abl_no_pf --config.noise.prototype_fixing=False
run abl_no_pn --checkpoint "$out/f2m" --config.eval.normalize_prototypes=False
fi
# Bound table: the paper's b (its code's config value) is twice our half-width noise.bound.
want bound && for b in 0.00125 0.0025 0.01 0.02 0.04; do
  run "bound_$b" --config.noise.bound="$b"
done
# Flatness table (N = 1000 draws unless DRAWS is set), skipped where flatness.json exists.
want flatness && for name in f2m baseline; do
  method=f2m; [ "$name" = baseline ] && method=baseline
  [ -f "$out/$name/flatness.json" ] && continue
  run "$name" --mode flatness --config.method="$method" --config.flatness.num_draws="${DRAWS:-1000}" \
      --config.flatness.max_images="${FLAT_IMAGES:-0}"
done

want main && python -m f2m_jax.run.report "$out/f2m" "$out/baseline" --labels="F2M,Baseline" --reference 1 \
    --out "$out/report_main"
want fidelity && python -m f2m_jax.run.report "$out/f2m" "$out"/fid_unrounded "$out"/fid_bn_clean "$out"/fid_gamma0 \
    "$out"/fid_pf_grad "$out"/fid_uniform "$out"/fid_exact_grad "$out"/fid_balanced "$out"/fid_paper \
    --labels="F2M (authors' code),unrounded steps,BN stats from the clean pass,gamma 0,PF with gradient,uniform noise,exact gradient,per-step random batches,all paper-literal" \
    --reference 0 --out "$out/report_fidelity"
want compared && python -m f2m_jax.run.report "$out/f2m" "$out/baseline" "$out/icarl" "$out/fsll" "$out/rebalance" \
    --labels="F2M,Baseline,iCaRL,FSLL,Rebalance" --reference 0 --out "$out/report_compared"
want compared && [ "$variant" != smoke ] && python -m f2m_jax.run.report "$out/ci_icarl" "$out/ci_rebalance" \
    --labels="iCaRL,Rebalance" --reference 0 --out "$out/report_class_incremental"
want upper && python -m f2m_jax.run.report "$out/f2m" "$out/baseline" "$out/joint" "$out/crt" \
    --labels="F2M,Baseline,joint,cRT" --reference cRT --out "$out/report_upper"
if want superclass; then
  for split in ${SPLITS:-superclass1 superclass2}; do
    python -m f2m_jax.run.report "$out/${split}_f2m" "$out/${split}_baseline" "$out/${split}_joint" "$out/${split}_crt" \
        --labels="F2M,Baseline,joint,cRT" --reference cRT --out "$out/report_$split"
  done
fi
want ablation && python -m f2m_jax.run.report "$out/abl_none" "$out/abl_pc" "$out/abl_no_pc" "$out/abl_no_pf" "$out/abl_no_pn" "$out/f2m" \
    --labels="-,PC,FM+PF+PN,FM+PC+PN,FM+PF+PC,FM+PF+PC+PN" --reference 5 --out "$out/report_ablation"
want bound && python -m f2m_jax.run.report "$out"/bound_0.00125 "$out"/bound_0.0025 "$out/f2m" "$out"/bound_0.01 "$out"/bound_0.02 \
    "$out"/bound_0.04 --labels="b=0.0025,b=0.005,b=0.01,b=0.02,b=0.04,b=0.08" --reference 2 --out "$out/report_bound"
true
