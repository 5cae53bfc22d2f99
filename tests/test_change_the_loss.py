"""docs/development.md's recipe 'Change the loss', applied: its term of the noisy passes
(noise.clean_ce_weight) is the code it names and is refused where the loss would leave it out; its
term of the clean pass (base.logit_penalty, of config.base) is added by running the recipe's blocks.
Each changes the loss and gradient as its formula says, against conftest.naive_logits in float64."""
from __future__ import annotations

import pathlib
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common, cifar100, cub200, mini
from conftest import init_variables, naive_logits, noise_view
from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax import trees
from f2m_jax import validation
from f2m_jax.models import build_model, noise_set_paths
from f2m_jax.run import pipeline

REPO = pathlib.Path(__file__).resolve().parents[1]
LIBRARY_FILES = {'configs/common.py', 'f2m_jax/validation.py', 'f2m_jax/base.py'}


def recipe_blocks(kind: str) -> list:
  """(file, code) of every python block of the recipe's section on `kind`, the file being the last
  `*.py` path named before the block."""
  text = (REPO / 'docs' / 'development.md').read_text()
  section = text.split(f'### A term of {kind}\n', 1)[1].split('\n## ', 1)[0].split('\n### ', 1)[0]
  parts = re.split(r'```python\n(.*?)```', section, flags=re.S)
  return [(re.findall(r'`([\w/]+\.py)`', prose)[-1], textwrap.dedent(code))
          for prose, code in zip(parts[::2], parts[1::2])]


def test_the_recipe_is_the_code_of_at_most_three_library_files():
  blocks = recipe_blocks('the noisy passes')
  assert len(blocks) == 3 and {f for f, _ in blocks} <= LIBRARY_FILES
  clean_pass = ['configs/common.py', 'f2m_jax/validation.py'] + ['f2m_jax/base.py'] * 2  # run by a test below
  assert [f for f, _ in recipe_blocks('the clean pass')] == clean_pass
  for path, code in blocks:
    lines = [l.strip() for l in (REPO / path).read_text().splitlines()]
    want = [l.strip() for l in code.strip().splitlines()]
    assert any(lines[i:i + len(want)] == want for i in range(len(lines))), f'{path} does not hold:\n{code}'


def test_the_default_leaves_the_term_out_and_a_weight_the_loss_would_ignore_is_refused(smoke_config):
  """A negative weight, and a nonzero one where noise is off (the loss is then the clean pass's CE alone:
  the Baseline's presets, or noise.enabled=False), are refused with one line naming the field."""
  for config in (common.base_config(), cifar100.get_config(), mini.get_config(), cub200.get_config()):
    assert config.noise.clean_ce_weight == 0.0
  smoke_config.noise.clean_ce_weight = -0.5
  with pytest.raises(ValueError, match=r"^noise.clean_ce_weight=-0.5 is invalid: must be >= 0$"):
    pipeline.resolve(smoke_config)
  smoke_config.noise.clean_ce_weight = 0.5
  smoke_config.method = 'baseline'
  noise_off = r"^noise.clean_ce_weight=0.5 is invalid: a term of the noisy passes, which method 'baseline' runs without"
  with pytest.raises(ValueError, match=noise_off) as e:
    pipeline.resolve(smoke_config)
  assert '\n' not in str(e.value) and '--config.noise.enabled=True' in str(e.value)
  pipeline.resolve(smoke_config, {'noise.enabled': True})  # the command line turns noise on: accepted


def _float64_case():
  """(model, params, batch_stats, images, labels) of a small ResNet-20 in float64, and the authors'
  M = 2 draws (uniform); call under jax.enable_x64."""
  model = build_model('resnet20', 4, 4, jnp.float64)
  variables = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), init_variables(model, 16))
  kx, ke = jax.random.split(jax.random.key(0))
  x = jax.random.normal(kx, (16, 16, 16, 3), jnp.float64)
  eps = noise_lib.sample_noise(ke, variables['params'], noise_set_paths(model, 4), 2, 0.05, 'uniform')
  case = (model, variables['params'], variables['batch_stats'], x, jnp.arange(16) % 4)
  return case, jax.tree_util.tree_map(lambda e: e.astype(jnp.float64), eps)


def _ce(logits, labels):
  return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(labels)), labels])


def _assert_term(case, eps, views, w, term):
  """L_w = L_0 + w term(params) and grad L_w = grad L_0 + w grad term, `views` the loss views at
  weights 0 and w, the logged loss (what the step minimises) moving alike; to 1e-9 of each gradient's
  largest entry (float64 agrees to about 1e-13), the term changing the gradient well above that.
  Returns (L_0, its metrics)."""
  model, params, stats, x, y = case
  loss_and_grad = jax.jit(jax.value_and_grad(base_lib.base_loss, has_aux=True), static_argnums=(5, 6))
  (l0, (_, m0)), g0 = loss_and_grad(params, stats, x, y, eps, model, views[0])
  (lw, (_, mw)), gw = loss_and_grad(params, stats, x, y, eps, model, views[1])
  value, gt = jax.jit(jax.value_and_grad(term))(params)
  np.testing.assert_allclose([float(lw), float(mw['loss'])], [float(l0) + w * float(value),
                                                             float(m0['loss']) + w * float(value)], rtol=1e-12)
  for path, got in trees.flatten(gw).items():
    want = np.asarray(trees.flatten(g0)[path] + w * trees.flatten(gt)[path])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * float(np.abs(want).max()), err_msg='/'.join(path))
    assert got.dtype == np.float64
  assert max(float(np.abs(a - b).max()) for a, b in zip(jax.tree_util.tree_leaves(gw),
                                                        jax.tree_util.tree_leaves(g0))) > 1e-4
  return float(l0), m0


@pytest.mark.slow
def test_the_noisy_pass_term_changes_the_loss_and_gradient_as_its_formula_says_float64():
  """noise.clean_ce_weight w: L_w = L_0 + w CE_clean, with the authors' PF and std term, the CEs from
  the naive logits. The logged loss is L less PF's mean, which has no gradient."""
  with jax.enable_x64(True):
    case, eps = _float64_case()
    model, params, stats, x, y = case
    views = [noise_view(clean_ce_weight=0.0), noise_view(clean_ce_weight=0.7)]
    l0, m0 = _assert_term(case, eps, views, 0.7, lambda p: _ce(naive_logits(model, p, stats, x, {})[1], y))
    draws, clean = naive_logits(model, params, stats, x, eps)
    np.testing.assert_allclose([float(m0['ce']), float(m0['ce_clean'])],
                               [np.mean([_ce(l, y) for l in draws]), float(_ce(clean, y))], rtol=1e-12)
    np.testing.assert_allclose(float(m0['loss']), l0 - views[0].pf_weight * float(m0['pf']), rtol=1e-12)


@pytest.mark.slow
def test_a_clean_pass_term_added_by_the_recipe_float64(monkeypatch, smoke_config):
  """The recipe's base.logit_penalty, its four blocks run as written: the field's default is 0, a
  negative weight is refused naming it, the loss view carries it from config.base, and with noise on
  (F2M's loss) and off (the clean CE alone, from the naive logits) it adds w mean(z^2) of the clean
  logits z. A LOSS_FIELDS name config.noise has is refused."""
  (_, field), (_, rule), (_, fields), (_, entry) = recipe_blocks('the clean pass')
  exec(field, {'c': smoke_config})  # pylint: disable=exec-used
  assert smoke_config.base.logit_penalty == 0.0
  smoke_config.base.logit_penalty = -0.5
  with pytest.raises(ValueError, match=r'^base.logit_penalty=-0.5 is invalid: must be >= 0$'):
    exec(rule, {'c': smoke_config, 'need': validation.need})  # pylint: disable=exec-used
  scope, loss_terms = {}, base_lib.loss_terms
  exec(fields, scope)  # pylint: disable=exec-used
  monkeypatch.setattr(base_lib, 'LOSS_FIELDS', scope['LOSS_FIELDS'])

  def with_term(out, loss):
    terms = loss_terms(out, loss)
    exec(entry, {'jnp': jnp, 'terms': terms, 'out': out, 'loss': loss})  # pylint: disable=exec-used
    return terms

  monkeypatch.setattr(base_lib, 'loss_terms', with_term)
  smoke_config.noise.draw_map, views = 'unroll', []
  for weight in (0.0, 0.3):
    smoke_config.base.logit_penalty = weight
    views.append(base_lib.loss_view(smoke_config))
  assert views[1].logit_penalty == 0.3 and views[1].std_weight == smoke_config.noise.std_weight
  with jax.enable_x64(True):
    case, eps = _float64_case()
    model, params, stats, x, y = case
    penalty = lambda p: jnp.mean(naive_logits(model, p, stats, x, {})[1] ** 2)
    _assert_term(case, eps, views, 0.3, penalty)
    l0, _ = _assert_term(case, {}, views, 0.3, penalty)
    np.testing.assert_allclose(l0, float(_ce(naive_logits(model, params, stats, x, {})[1], y)), rtol=1e-12)
  monkeypatch.setattr(base_lib, 'LOSS_FIELDS', ('noise.M',))
  with pytest.raises(ValueError, match=r'^base.LOSS_FIELDS names noise.M, whose name config.noise has'):
    base_lib.loss_view(smoke_config)
