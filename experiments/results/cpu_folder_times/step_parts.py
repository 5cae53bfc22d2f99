"""What F2M's base step adds to the plain step on configs/folder.py:cpu's ResNet-18 (issue 83): the share of
the network the noise set covers (its parameters, the convolution FLOPs of the noised suffix, the suffix's
share of a test-view forward pass) and the time of the M noise draws alone, jitted, on this machine.

  python experiments/results/cpu_folder_times/step_parts.py [configs/folder.py:cpu]
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..', '..'))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from f2m_jax import evaluator, noise, trees  # noqa: E402
from f2m_jax.run import bench, cli, pipeline  # noqa: E402


def median_ms(fn, *args, n=20):
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def main(spec):
  config = cli.load_config(spec)
  config.data.folder.update(train='/unused', num_base=60, way=5, num_sessions=9)
  config = pipeline.resolve(config, reads_data=False)
  exp = bench.bench_experiment(config, 'float32')
  state = exp.init_state()
  flat = trees.flatten(state.params)
  noised = sum(flat[p].size for p in exp.noise_paths)
  print(f'{spec}: {config.model.arch}, width {config.model.width}, {config.data.image_size} px, batch '
        f'{bench.base_batch(config)}, noise.num_layers {config.noise.num_layers}, M {config.noise.M}')
  print(f'parameters: {sum(v.size for v in flat.values()):,}, in the noise set {noised:,}; the suffix starts at '
        f'block {exp.split} of {exp.model.num_blocks}')
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  images = exp.bench.test.images[:config.eval.batch_size]
  trunk = evaluator.embedder(exp, last=exp.split)(variables, images, keep_on_device=True)
  whole = median_ms(evaluator.embedder(exp), variables, images)
  suffix = median_ms(evaluator.embedder(exp, first=exp.split), variables, trunk)
  print(f'test-view forward of {len(images)} images: whole network {whole:.1f} ms, the suffix alone {suffix:.1f} '
        f'ms ({suffix / whole:.0%})')
  draw = jax.jit(lambda key, params: noise.sample_noise(key, params, exp.noise_paths, config.noise.M,
                                                       config.noise.bound, config.noise.distribution))
  print(f'the M = {config.noise.M} draws of the noise set ({config.noise.distribution}): '
        f'{median_ms(draw, jax.random.key(0), state.params):.1f} ms a step (median of 20)')
  flops = [jax.jit(lambda x, first=first: exp.model.apply(variables, x, train=False, first=first)).lower(
      jax.ShapeDtypeStruct(x.shape, np.float32)).cost_analysis()['flops'] for first, x in ((0, images), (exp.split, trunk))]
  print(f'XLA FLOPs of that forward pass: whole network {flops[0] / 1e9:.3f} G, the suffix {flops[1] / 1e9:.3f} G '
        f'({flops[1] / flops[0]:.0%})')


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else 'configs/folder.py:cpu')
