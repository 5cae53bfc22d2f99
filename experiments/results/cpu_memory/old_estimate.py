"""d41b789's memory estimate for the runs of table.py (run from the root of a d41b789 checkout): old_estimate.txt."""
import glob, os, re, shlex, sys
sys.path.insert(0, os.getcwd())
from absl import flags
from ml_collections import config_flags
from f2m_jax import cli, memory, pipeline
GIB = 2 ** 30
def eff(argv):
  v = flags.FlagValues(); cli.define_flags(v); sys.argv = ['run.py'] + argv; cli.parse_flags(sys.argv, v)
  return pipeline.effective(v['config'].value, config_flags.get_override_values(v['config']))
rows = [(n, c) for n, c in (open(p).read().split('\n', 1)[0].split(': ', 1) for p in sorted(glob.glob(os.path.join(os.path.dirname(os.path.abspath(__file__)), '*.time')))) if '--dry-run' not in c]
rows += [(n, 'python run.py --config configs/cifar100.py:smoke ' + c) for n, c in [('eval354535', '--config.eval.batch_size=354535'), ('eval709070', '--config.eval.batch_size=709070'), ('pool22000', '--config.data.synthetic.train_per_class=22000')]]
for name, command in rows:
  parts = memory.estimate(eff(shlex.split(command)[2:]))
  print(name, f'{sum(p[3] for p in parts) / GIB:.2f}', memory.verdict(parts, 24 * GIB, None)[0])
