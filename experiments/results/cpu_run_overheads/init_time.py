import sys, time
sys.path.insert(0, '.')
import importlib
import jax
from f2m_jax import bench as bench_lib, pipeline
from f2m_jax.experiment import Experiment
name = sys.argv[1]
cfg = importlib.import_module(f'configs.{name}').get_config()
cfg = pipeline.resolve(cfg, reads_data=False)
b = bench_lib.random_benchmark(cfg, 120, 20)
exp = Experiment.create(cfg, b)
exp.state_shapes()  # as the pipeline: shapes are known before the init
t = time.perf_counter(); s = exp.init_state(); jax.block_until_ready(s); t1 = time.perf_counter() - t
t = time.perf_counter(); s = exp.init_state(); jax.block_until_ready(s); t2 = time.perf_counter() - t
print(f'{name} first {t1:.2f} s, second {t2:.3f} s')
