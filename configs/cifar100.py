"""F2M on CIFAR-100 (60 base classes, 8 sessions of 5-way 5-shot, ResNet-20).

  python run.py --config configs/cifar100.py --workdir W               # full protocol: official archive, downloaded once
  python run.py --config configs/cifar100.py:trainsplit --workdir W    # real data offline (F2M_DATA_DIR)
  python run.py --config configs/cifar100.py:smoke --workdir W         # synthetic: 37 s on 2 CPU cores, 14 s cached
  python run.py --config configs/cifar100.py:cpu --workdir W           # 1,000 steps: 5 min 49 s on 2 cores (trainsplit)

Arguments: none (the original's full budget: 30,003 base iterations, lr 0.1 x 0.01 at 15,000, M=2,
b=0.005, 10 draws), `trainsplit` (the project's fixed comparison budget on cifar100_train.npz: 3,000
iterations of batch 256, lr 0.1 x 0.01 at 1,500), `cpu` (common.make_cpu: 1,000 iterations of batch
64, lr 0.05, 5 runs), `smoke`. Any field can be overridden, e.g.
`--config.noise.M=4 --config.method=baseline`; `--config.data.split=superclass1` (or `superclass2`)
runs the paper's appendix class splits by superclass (30 base classes, 4 sessions of 5) on either
source.

Headline (`:trainsplit`, the default F2M over five base seeds on an H200): session 9 at 31.27 +- 0.96
(95% interval of the mean over the seeds, Student's t), PD 15.67 (experiments/results/README.md,
section 18, with the Baseline and the authors' code).
`:smoke` (synthetic data, chance 5%): session 1 at about 76%, 37 s on 2 CPU cores (24 s of it compiling;
14 s with the programs cached: experiments/results/README.md, section 25).
"""
from configs import common


def get_config(arg: str = ''):
  config = common.base_config()
  config.data.dataset = 'cifar100'
  config.data.source = 'tfds'
  config.model.arch = 'resnet20'
  config.noise.num_layers = 4
  config.noise.bound = 0.005
  config.base.steps = 30003
  config.base.milestones = (15000,)
  config.base.lr_gamma = 0.01
  config.incremental.lr = 0.01

  variant = common.parse_arg(arg, ('', 'smoke', 'trainsplit', 'cpu'))
  if variant == 'trainsplit':
    config.data.source = 'trainsplit'
    config.base.steps = 3000
    config.base.milestones = (1500,)
  elif variant == 'smoke':
    common.make_smoke(config)
  elif variant == 'cpu':
    common.make_cpu(config)
  return config
