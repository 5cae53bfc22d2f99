"""docs/development.md's recipe 'Change the loss', applied: its example term (the clean pass's
cross-entropy with weight noise.clean_ce_weight) is the code of the three files it names, is refused
where the loss would leave it out, and changes the loss and its gradient as its formula says, against
the naive float64 cross-entropies of conftest."""
from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import common, cifar100, cub200, mini
from conftest import init_variables, naive_cross_entropies, noise_view
from f2m_jax import base as base_lib
from f2m_jax import noise as noise_lib
from f2m_jax import trees
from f2m_jax.models import build_model, noise_set_paths
from f2m_jax.run import pipeline

REPO = pathlib.Path(__file__).resolve().parents[1]
LIBRARY_FILES = {'configs/common.py', 'f2m_jax/validation.py', 'f2m_jax/base.py'}


def recipe_blocks() -> list:
  """(file, code) of every python block of the recipe, the file being the last `*.py` path named
  before the block."""
  text = (REPO / 'docs' / 'development.md').read_text()
  section = text.split('## Change the loss\n', 1)[1].split('\n## ', 1)[0]
  blocks, prose = [], ''
  for i, part in enumerate(re.split(r'```python\n(.*?)```', section, flags=re.S)):
    if i % 2:
      blocks.append((re.findall(r'`([\w/]+\.py)`', prose)[-1], part))
    else:
      prose = part
  return blocks


def test_the_recipe_is_the_code_of_at_most_three_library_files():
  blocks = recipe_blocks()
  assert len(blocks) == 3 and {f for f, _ in blocks} <= LIBRARY_FILES
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


@pytest.mark.slow
def test_the_term_changes_the_loss_and_gradient_as_its_formula_says_float64():
  """L_w = L_0 + w CE_clean and grad L_w = grad L_0 + w grad CE_clean, with the authors' M = 2 draws, PF
  and std term, CE_clean and the draws' CEs from the naive float64 reference (conftest); to 1e-9 of each
  gradient's largest entry (float64 agrees to about 1e-13). The logged loss is what the step minimises:
  L less PF's mean, which has no gradient."""
  w = 0.7
  with jax.enable_x64(True):
    model = build_model('resnet20', 4, 4, jnp.float64)
    variables = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), init_variables(model, 16))
    params, stats = variables['params'], variables['batch_stats']
    kx, ke = jax.random.split(jax.random.key(0))
    x = jax.random.normal(kx, (16, 16, 16, 3), jnp.float64)
    y = jnp.arange(16) % 4
    eps = noise_lib.sample_noise(ke, params, noise_set_paths(model, 4), 2, 0.05, 'uniform')
    eps = jax.tree_util.tree_map(lambda e: e.astype(jnp.float64), eps)
    loss_and_grad = jax.jit(jax.value_and_grad(base_lib.base_loss, has_aux=True), static_argnums=(5, 6))
    (l0, (_, m0)), g0 = loss_and_grad(params, stats, x, y, eps, model, noise_view(clean_ce_weight=0.0))
    (lw, _), gw = loss_and_grad(params, stats, x, y, eps, model, noise_view(clean_ce_weight=w))

    reference = lambda p: naive_cross_entropies(model, p, stats, x, y, eps)
    (ce_clean, per_draw), gc = jax.jit(jax.value_and_grad(lambda p: reference(p)[::-1], has_aux=True))(params)
    np.testing.assert_allclose([float(m0['ce']), float(m0['ce_clean'])], [float(per_draw.mean()), float(ce_clean)],
                               rtol=1e-12)
    np.testing.assert_allclose(float(lw), float(l0) + w * float(ce_clean), rtol=1e-12)
    np.testing.assert_allclose(float(m0['loss']), float(l0) - common.base_config().noise.pf_weight * float(m0['pf']),
                               rtol=1e-12)
    want = jax.tree_util.tree_map(lambda a, b: a + w * b, g0, gc)
    for path, got in trees.flatten(gw).items():
      expected = np.asarray(trees.flatten(want)[path])
      scale = float(np.abs(expected).max())
      np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9 * scale, err_msg='/'.join(path))
      assert got.dtype == np.float64
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in
                zip(jax.tree_util.tree_leaves(gw), jax.tree_util.tree_leaves(g0)))
    assert moved > 1e-4  # the term changed the gradient, well above the tolerance
