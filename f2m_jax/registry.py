"""The methods by name: the one place that lists them (nothing below the pipeline imports it).
Adding a method: a module in f2m_jax/methods/ defining its `Method`, and one line here."""
from f2m_jax.methods import fsll, icarl, joint, ncm, rebalance

METHODS = {m.name: m for m in (ncm.F2M, ncm.BASELINE, joint.JOINT, joint.CRT, icarl.ICARL,
                               rebalance.REBALANCE, fsll.FSLL)}


def get(name):
  if name not in METHODS:
    raise ValueError(f'method={name!r} is not one of {tuple(METHODS)}')
  return METHODS[name]


def method_sections():
  """{section: method name}: the config sections one method alone reads (workdir's
  config_differences)."""
  return {m.section: m.name for m in METHODS.values() if m.section}
