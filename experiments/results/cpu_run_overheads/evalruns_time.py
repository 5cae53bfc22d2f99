"""CPU timing: Evaluator.accuracies_runs for 3 runs vs 3 calls of Evaluator.accuracies (cifar100 smoke)."""
import sys, time
sys.path.insert(0, '.')
import jax, numpy as np
from configs import cifar100
from f2m_jax import pipeline, experiment as experiment_lib, evaluator, trees
from f2m_jax.data import sources

cache = sys.argv[1] == 'cache' if len(sys.argv) > 1 else True
config = cifar100.get_config('smoke')
config.eval.cache_trunk = cache
config = pipeline.resolve(config)
exp = experiment_lib.Experiment.create(config, sources.load_benchmark(config))
state = exp.init_state()
base = {'params': state.params, 'batch_stats': state.batch_stats}
paths = exp.trainable_paths(state.params)
ev = evaluator.Evaluator(exp, base, paths)
print('trunk cached:', ev._trunk is not None, 'test images', len(exp.bench.test.labels), 'devices', jax.devices())
rng = np.random.default_rng(0)
flat = trees.flatten(jax.device_get(state.params))
runs = [trees.unflatten({p: v + (0.01 * rng.normal(size=v.shape)).astype(v.dtype) if p in set(paths) else v
                         for p, v in flat.items()}) for _ in range(3)]
session = exp.bench.num_sessions
C = exp.bench.num_seen_classes(session)
protos = [rng.normal(size=(C, exp.embedding_dim())).astype(np.float32) for _ in range(3)]
one = lambda: [ev.accuracies({'params': p, 'batch_stats': state.batch_stats}, q, session, changed=True)
               for p, q in zip(runs, protos)]
together = lambda: ev.accuracies_runs(runs, protos, session)
a, b = one(), together()  # compiles
print('per-run', [x['acc'] for x in a]); print('one-call', [x['acc'] for x in b])
for name, f in (('3 x accuracies', one), ('accuracies_runs(3)', together)) * 2:
  ts = []
  for _ in range(5):
    t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
  print(f'{name}: median {np.median(ts)*1e3:.1f} ms, min {min(ts)*1e3:.1f} ms over 5')
