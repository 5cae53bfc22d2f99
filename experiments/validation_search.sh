#!/usr/bin/env bash
# The search for an F2M variant on the validation protocol (data.protocol=validation: pseudo-base and
# pseudo-novel classes carved from the base classes, held-out training images as test images; no test
# image is read), then the chosen rows once on the test protocol. docs/data.md describes the protocol;
# experiments/results/README.md section 16 holds the tables.
#
#   experiments/validation_search.sh validation OUT [ROW...]   # the candidates (default: all)
#   experiments/validation_search.sh test OUT f2m_v f2m baseline baseline_pn   # the table on the real protocol
#   STEPS=30 RUNS=2 CFG=configs/cifar100.py:smoke experiments/validation_search.sh validation OUT
#
# STEPS: base iterations (lr x 0.01 at STEPS/2; default 400), RUNS: draws of the shots (default 5 on
# validation, 10 on test), CFG: the dataset config (default configs/cifar100.py:trainsplit).
# Rows that differ only in their sessions reuse a base model (--checkpoint). Workdirs resume.
set -euo pipefail
protocol=${1:?usage: experiments/validation_search.sh validation|test OUT [ROW...]}
out=${2:?usage: experiments/validation_search.sh validation|test OUT [ROW...]}
shift 2
case $protocol in validation|test) ;; *) echo "protocol $protocol: one of validation, test" >&2; exit 2;; esac
steps=${STEPS:-400}
cfg=${CFG:-configs/cifar100.py:trainsplit}
if [ "$protocol" = validation ]; then runs=${RUNS:-5}; else runs=${RUNS:-10}; fi
common=(--config.base.steps="$steps" --config.base.milestones="($((steps / 2)),)" --config.runs="$runs")
[ "$protocol" = validation ] && common+=(--config.data.protocol=validation)

# Candidate base trainings: each a change of the defaults (the authors' F2M) that keeps the method
# (noise on the noise set within +- b, PF, the clamp box for any fine-tuning, prototypes, NCM with PN).
std0=(--config.noise.std_weight=0.0 --config.noise.distribution=uniform)
declare -A rows=(
  [f2m]=""
  [f2m_noft]="--checkpoint=f2m --config.incremental.finetune=False"
  [std0_uniform]="${std0[*]}"
  [std0_uniform_noft]="--checkpoint=std0_uniform ${std0[*]} --config.incremental.finetune=False"
  [std0_uniform_shuffle]="${std0[*]} --config.base.sampler=shuffle"
  [std0_uniform_shuffle_noft]="--checkpoint=std0_uniform_shuffle ${std0[*]} --config.base.sampler=shuffle --config.incremental.finetune=False"
  [shuffle]="--config.base.sampler=shuffle"
  [shuffle_noft]="--checkpoint=shuffle --config.base.sampler=shuffle --config.incremental.finetune=False"
  [std0_uniform_shuffle_b2]="${std0[*]} --config.base.sampler=shuffle --config.noise.bound=0.01"
  [std0_uniform_shuffle_b2_noft]="--checkpoint=std0_uniform_shuffle_b2 ${std0[*]} --config.base.sampler=shuffle --config.noise.bound=0.01 --config.incremental.finetune=False"
  [f2m_v]="--variant"  # configs/f2m_v.py over the same dataset config: the variant the search chose
  [baseline]="--config.method=baseline"
  # the Baseline's network with PN: F2M's pipeline with FM, PF and fine-tuning off (PN is F2M's)
  [baseline_pn]="--checkpoint=baseline --config.noise.enabled=False --config.noise.prototype_fixing=False --config.base.sampler=shuffle --config.incremental.finetune=False"
)
order=(f2m baseline baseline_pn std0_uniform std0_uniform_shuffle f2m_noft std0_uniform_noft std0_uniform_shuffle_noft
       shuffle shuffle_noft std0_uniform_shuffle_b2 std0_uniform_shuffle_b2_noft)
[ $# -gt 0 ] && order=("$@")
for name in "${order[@]}"; do
  [ -n "${rows[$name]+x}" ] || { echo "unknown row $name: one of ${!rows[*]}" >&2; exit 2; }
  read -r -a args <<< "${rows[$name]}"
  for i in "${!args[@]}"; do  # --checkpoint=ROW names another row's workdir
    [[ "${args[$i]}" == --checkpoint=* ]] && args[$i]="--checkpoint=$out/${args[$i]#--checkpoint=}"
  done
  row_cfg=$cfg
  if [ "${args[*]-}" = --variant ]; then  # configs/cifar100.py:trainsplit -> configs/f2m_v.py:cifar100:trainsplit
    base=${cfg%%:*}; base=${base##*/}; row_cfg="configs/f2m_v.py:${base%.py}"
    [[ "$cfg" == *:* ]] && row_cfg="$row_cfg:${cfg#*:}"
    args=()
  fi
  echo "=== $name $(date -u +%FT%TZ) $row_cfg"
  python run.py --config "$row_cfg" --workdir "$out/$name" "${common[@]}" ${args[@]+"${args[@]}"}
done
