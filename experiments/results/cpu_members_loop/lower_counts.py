# Counts the convolutions of the vmapped 2-member F2M base step (configs/cifar100.py, batch 256, M = 2,
# noise.draw_map=vmap) lowered for CUDA on the CPU, by kind and group counts (results section 20).
#   F2M_DATA_DIR=... PYTHONPATH=. python3 experiments/results/cpu_members_loop/lower_counts.py
import collections, re
import jax, jax.numpy as jnp, numpy as np
from configs import cifar100
from f2m_jax import base as base_lib, pipeline
from f2m_jax.data import synthetic
from f2m_jax.experiment import Experiment
CONV = re.compile(r'stablehlo\.convolution.*dim_numbers = \[(\w), .*?\]x\[(\d+|\w), (\d+|\w), .*?window = .*?batch_group_count = (\d+) : i64, feature_group_count = (\d+) : i64')
config = cifar100.get_config()
config.noise.draw_map = 'vmap'
config = pipeline.resolve(config, reads_data=False)
bench = synthetic.make_synthetic(num_base=60, way=5, num_sessions=2, train_per_class=5, test_per_class=1)
exp = Experiment.create(config, bench)
step = base_lib.train_step_fn(exp.base_objective(), exp.optimizer(), bench.augment, bench.image_size, bench.mean, bench.std)
S, B = 2, 256
state = exp.init_state()
stacked = jax.tree_util.tree_map(lambda x: jnp.stack([x] * S), state)
fn = jax.vmap(step)
args = (stacked, np.zeros((S, B, 32, 32, 3), np.uint8), np.zeros((S, B), np.int32), jnp.stack([jax.random.key(i) for i in range(S)]))
text = jax.jit(fn).trace(*args).lower(lowering_platforms=('cuda',)).as_text()
count = collections.Counter()
for line in text.splitlines():
  if 'stablehlo.convolution' in line:
    m = re.search(r'dim_numbers = \[(\w), ', line); bg = int(re.search(r'batch_group_count = (\d+)', line).group(1)); fg = int(re.search(r'feature_group_count = (\d+)', line).group(1))
    kind = 'kernel_grad' if m.group(1) == 'f' else 'forward/input_grad'
    count[(kind, f'batch_group_count={bg}', f'feature_group_count={fg}')] += 1
for k, v in sorted(count.items()): print(v, *k)
