"""The interface every method implements. Methods plug into the one pipeline: each supplies how session
1 trains, what a later session updates and how a test image is classified; the pipeline (data,
protocol, runs, checkpoints, results, report) is shared and has no branch on the method. A method
lives in a module of its own here, may use f2m_jax.methods.common (what several methods share) and
the layers below (f2m_jax.experiment, train_loop, evaluator, ...), never the pipeline, the registry
or another method's private names; f2m_jax/registry.py lists it (docs/development.md: adding one).

A `Method` is:
  presets: {dotted field: value}            the shared config fields the method sets (e.g. the
                                            Baseline's noise.enabled=False), applied by
                                            pipeline.resolve over the config file's values but never
                                            over a field changed on the command line (then validated)
  first_session(exp, ckpts, log, source, hook) -> dict
                                            session 1's model, shared by every run, checkpointed as
                                            the workdir's `model` ({'params', 'batch_stats',
                                            'prototypes'}); `source` is --checkpoint's workdir
  runner(exp, first, ckpts, source, log) -> runner
  section                                   optional: the config section the method alone reads
                                            (config.<section>; its values are in configs/common.py,
                                            METHOD_SECTIONS, so that loading a config imports no method)
  validate(config)                          optional: raises ValueError naming a bad value of its
                                            section (f2m_jax.validation.need), before anything is
                                            written

and a runner (built once per pipeline run, holding its compiled functions; f2m_jax/sessions.py
calls it run by run, session by session) has:
  first_accuracies() -> dict                session 1's accuracies, the keys of `accuracies`
  start() -> state                          a run's state before session 2 (any Python value; the
                                            runner alone reads it)
  update(state, run, session, exemplars) -> (state, info)
                                            session `session`'s training of run `run`. `exemplars`:
                                            int64 indices into exp.bench.train of every shot this run
                                            has seen, sessions 2..`session` in order, this session's
                                            way x shots last (exp.config.data.shots per new class);
                                            the images are exp.bench.train.images[exemplars]. `info`:
                                            JSON-serialisable values for metrics.jsonl (e.g. losses)
  accuracies(state, session) -> dict        test accuracies over all classes seen by `session`, in
                                            percent, with exactly the keys 'acc', 'acc_base',
                                            'acc_novel' and 'hm' (floats; 'acc_novel' and 'hm' None
                                            where no novel class is seen); f2m_jax.evaluation's NCM
                                            functions return this dict
  template(session) -> dict, item(state) -> dict, restore(saved) -> state
                                            what a session checkpoint holds, and back: `item` gives a
                                            dict of arrays (not named 'exemplars' or 'accuracy',
                                            which the sessions add), `template(session)` a dict of
                                            arrays of exactly the shapes and dtypes of `item(state)`
                                            for a state after `session` (orbax restores into it: any
                                            other shape fails the restore), and `restore(item(s))` a
                                            state whose accuracies and later updates equal those of s
  norms(state) -> dict or None              prototype norms after the last session (NCM methods;
                                            f2m_jax.evaluation.prototype_norms)

The shortest route to a new NCM-style method is a subclass of f2m_jax.methods.ncm.NCMRunner
(docs/development.md, "Adding a method", has the smallest complete example, which the test suite
registers and runs).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  presets: Mapping[str, Any]
  first_session: Callable
  runner: Callable
  description: str = ''
  section: str = ''
  validate: Optional[Callable] = None
