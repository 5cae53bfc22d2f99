"""Plain class-incremental learning on CIFAR-100: the check of iCaRL and Rebalance (LUCIR) that the
F2M paper's appendix uses for its re-implementations ("CIFAR-100 for incremental learning, 20
exemplars per class, as in Rebalance", compared with the curves the LUCIR paper reports).

  python run.py --config configs/cifar100_incremental.py --workdir W                 # TFDS data
  python run.py --config configs/cifar100_incremental.py:trainsplit --workdir W      # offline
  python run.py --config configs/cifar100_incremental.py:trainsplit --config.method=rebalance --workdir W

Protocol (`data.split='incremental50'`, f2m_jax/data/cifar100.py): the classes in LUCIR's order
(NumPy's legacy RNG seeded with 1993 permuting 0..99), 50 base classes, then 5 sessions of 10
classes, each bringing every training image of its classes (`data.shots` = 500 on TFDS, 400 on
trainsplit); 20 exemplars per class chosen by herding; nearest-mean-of-exemplars accuracy on the test
images of all classes seen. Every run sees the same images, so one run by default.

Everything else is the FSCIL setting of configs/cifar100.py with its `trainsplit` budget: the
ResNet-20, each method's own base session (3,000 iterations of 256 on trainsplit, 30,003 on TFDS),
and the authors' FSCIL session schedule of `icarl` / `rebalance` (90 epochs of batch 120, lr 0.1 x 0.1
after epochs 50 and 70). Rebalance keeps LUCIR's published CIFAR-100 settings here (lambda_base 5,
herding, nearest mean of exemplars), not the authors' FSCIL ones. LUCIR's own runs use a ResNet-32 and
160 epochs per session: this is a check of the curves' shape (Rebalance forgets less than iCaRL), not
of their values.
"""
from configs import cifar100, common


def get_config(arg: str = ''):
  variant = common.parse_arg(arg, ('', 'trainsplit'))
  config = cifar100.get_config(variant)
  config.method = 'icarl'
  config.data.split = 'incremental50'
  config.data.shots = 400 if variant == 'trainsplit' else 500
  config.runs = 1
  config.icarl.memory = 20
  config.rebalance.update(memory=20, lambda_base=5.0, exemplars='herding', classifier='nearest_mean')
  return config
