"""python probe.py on|off RUNS_PER_CALL [BASE_STEPS]: a smoke run (workdir and results in the current
folder), its wall time and the programs compiled after base training, by thread."""
import os, sys, threading, time, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), *['..'] * 4))  # the repo
import jax, jax.monitoring
from configs import cifar100
from f2m_jax import pipeline
events = []
state = {'phase': 'start'}
def listener(event, duration, **kw):
  if event == '/jax/core/compile/backend_compile_duration':
    events.append((state['phase'], threading.current_thread().name, kw.get('fun_name'), round(duration, 3)))
jax.monitoring.register_event_duration_secs_listener(listener)
def hook(kind, **kw):
  if kind == 'base_step' and kw['step'] == cfg.base.steps: state['phase'] = 'after_base'
  if kind == 'session': state['phase'] = 'sessions'
mode, runs_per_call = sys.argv[1], int(sys.argv[2])
cfg = cifar100.get_config('smoke')
cfg.base.steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
cfg.compile_ahead = mode
cfg.incremental.parallel_runs = runs_per_call
t = time.time()
res = pipeline.run(cfg, f'w_{mode}_{runs_per_call}', hook=hook)
print('wall', time.time() - t)
main_after = [e for e in events if e[0] != 'start' and e[1] == 'MainThread']
print('main-thread compiles after base:', len(main_after), sorted(set(e[2] for e in main_after)))
print('   of which >0.05s:', [e for e in main_after if e[3] > 0.05])
print('background:', [e for e in events if e[1] != 'MainThread'])
json.dump(pipeline_res := {k: v for k, v in res.items() if k != 'provenance'}, open(f'res_{mode}_{runs_per_call}.json', 'w'))
