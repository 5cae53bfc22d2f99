"""python count_ops.py OUT VARIANT: the compiled base program of the cifar100 smoke config (one member, 5 steps a
call; VARIANT plain, f2m2 or f2m4) of the checkout on sys.path: its optimized HLO text, without metadata and with
instruction numbers and the wrapper's names normalised (OUT.norm), and the count of each opcode (OUT.json)."""
import collections, dataclasses, json, re, sys
import ml_collections
from configs import cifar100
from f2m_jax import bench as bench_lib, pipeline, sharding
out, variant = sys.argv[1:3]
config = pipeline.resolve(cifar100.get_config('smoke'), reads_data=False)
exp = bench_lib.bench_experiment(config, 'float32')
m = {'plain': 0, 'f2m2': 2, 'f2m4': 4}[variant]
if hasattr(exp, 'noise'):  # this branch
  noise = ml_collections.FrozenConfigDict({**exp.loss, 'M': m or 2, 'enabled': bool(m)})
else:  # 0739cee
  noise = dataclasses.replace(exp.base_objective(), num_draws=m or 2, **({} if m else {'noise_paths': ()}))
case = bench_lib.program_case(exp, noise, variant, m, 1, sharding.data_mesh())
text = case.fn.lower(*case.args).compile().as_text()
ops = collections.Counter(mt.group(1) for mt in re.finditer(r'= \S+ ([a-z][\w-]*)\(', text))
json.dump(dict(sorted(ops.items())), open(out + '.json', 'w'), indent=0)
text = re.sub(r', metadata=\{[^}]*\}', '', text)
lines = [l for l in text.splitlines() if l.strip() and not re.match(r'^(\d+ [{"]|FileNames|FunctionNames|FileLocations|StackFrames)', l)]
text = '\n'.join(lines)
text = re.sub(r'(%[A-Za-z_][A-Za-z0-9_-]*)\.\d+', r'\1.N', text)
text = re.sub(r'(^|[ (,])([a-z_][a-z0-9_-]*)\.\d+', r'\1\2.N', text, flags=re.M)
text = re.sub(r'region_\d+', 'region_N', text)
text = re.sub(r'_param_\d+', '_param_N', text)
text = re.sub(r'make_train_step__locals__train_step|make_train_program__locals__member_step', 'STEP', text)
open(out + '.norm', 'w').write(text)
print(variant, sum(ops.values()), 'instructions')
