"""python timed_run.py ARGS...: run.py ARGS, then on stderr the seconds XLA spent compiling (jax.monitoring)."""
import atexit, os, runpy, sys, time
import jax.monitoring
total = {'s': 0.0, 'n': 0}
def listen(event, duration, **kw):
  if event == '/jax/core/compile/backend_compile_duration':
    total['s'] += duration; total['n'] += 1
jax.monitoring.register_event_duration_secs_listener(listen)
t0 = time.time()
atexit.register(lambda: print(f"TIMED: wall {time.time() - t0:.1f} s, XLA compiles {total['s']:.1f} s in {total['n']} programs", file=sys.stderr))
sys.argv = ['run.py'] + sys.argv[1:]
sys.path.insert(0, os.getcwd())
runpy.run_path('run.py', run_name='__main__')
