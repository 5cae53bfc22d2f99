"""Methods plug into the one pipeline (DESIGN.md sec. 3): each supplies how session 1 trains, what a
later session updates and how a test image is classified; the pipeline (data, protocol, runs,
checkpoints, results, report) is shared and has no branch on the method.

A `Method` is:
  configure(config)                         the method's effective config (in place; then validated)
  first_session(exp, ckpts, log, source, hook) -> dict
                                            session 1's model, shared by every run, checkpointed as
                                            the workdir's `model` ({'params', 'batch_stats',
                                            'prototypes'}); `source` is --checkpoint's workdir
  runner(exp, first, ckpts, source, log) -> Runner
  compile_ahead(exp) -> [plan]              optional: the programs its runner's first session calls,
                                            as f2m_jax/programs.py plans from shapes alone, compiled
                                            in the background while session 1 trains

and a Runner (built once per pipeline run, holding its compiled functions) has:
  first_accuracies() -> dict                session 1's accuracies (acc, acc_base, acc_novel, hm)
  start() -> state                          a run's state before session 2
  update(state, run, session, exemplars) -> (state, info)
                                            the session's training; info goes to metrics.jsonl
  accuracies(state, session) -> dict        test accuracies over all seen classes
  template(session) -> dict, item(state) -> dict, restore(saved) -> state
                                            what a session checkpoint holds, and back
  norms(state) -> dict or None              prototype norms after the last session (NCM methods)
  update_runs(states, runs, session, exemplars) -> [(state, info)]
                                            `update` for several runs of one session; `Runner`'s
                                            default updates them one by one, a method may map them
                                            together (F2M: jax.vmap over the runs)
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  configure: Callable
  first_session: Callable
  runner: Callable
  description: str = ''
  compile_ahead: Optional[Callable] = None


class Runner:
  """Base of every runner: the default `update_runs`."""

  def update_runs(self, states: list, runs: list, session: int, exemplars: list) -> list:
    return [self.update(s, r, session, e) for s, r, e in zip(states, runs, exemplars)]


def registry() -> dict:
  from f2m_jax.methods import fsll, icarl, joint, ncm, rebalance  # pylint: disable=g-import-not-at-top
  return {m.name: m for m in (ncm.F2M, ncm.BASELINE, joint.JOINT, joint.CRT, icarl.ICARL, rebalance.REBALANCE,
                              fsll.FSLL)}


def get(name: str) -> Method:
  methods = registry()
  if name not in methods:
    raise ValueError(f'method={name!r} is not one of {tuple(methods)}')
  return methods[name]
