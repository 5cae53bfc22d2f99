"""torchvision ResNet-18 weights (a `.pth` state dict) -> our Flax ResNet-18 params and batch stats, by
name (ours follow torchvision). The classifier converts only when its shape matches; any other missing,
unexpected or mis-shaped entry is an error. Reading a `.pth` needs PyTorch."""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

TORCHVISION_URL = 'https://download.pytorch.org/models/resnet18-f37072fd.pth'  # IMAGENET1K_V1


class WeightsError(ValueError):
  """Pretrained weights missing, unreadable or not matching the model; the message says what to do."""


def _flatten(tree: Mapping, prefix: tuple = ()) -> dict:
  out = {}
  for k, v in tree.items():
    if isinstance(v, Mapping):
      out.update(_flatten(v, prefix + (k,)))
    else:
      out[prefix + (k,)] = v
  return out


def _unflatten(flat: Mapping) -> dict:
  out: dict = {}
  for path, v in flat.items():
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    node[path[-1]] = v
  return out


def torch_name(collection: str, path: tuple) -> str:
  """The torchvision state-dict key of our leaf `path` in `collection` ('params' or 'batch_stats')."""
  *module, leaf = path
  parts = []
  for m in module:
    match = re.fullmatch(r'layer(\d+)_(\d+)', m)
    if match:
      parts += [f'layer{match.group(1)}', match.group(2)]
    elif m == 'downsample_conv':
      parts += ['downsample', '0']
    elif m == 'downsample_bn':
      parts += ['downsample', '1']
    else:
      parts.append(m)
  is_bn = bool(module) and ('bn' in module[-1])
  if collection == 'batch_stats':
    name = {'mean': 'running_mean', 'var': 'running_var'}[leaf]
  elif leaf == 'kernel':
    name = 'weight'
  elif leaf == 'scale' and is_bn:
    name = 'weight'
  else:
    name = leaf  # bias
  return '.'.join(parts + [name])


def _to_numpy(value) -> np.ndarray:
  if hasattr(value, 'detach'):  # a torch tensor
    value = value.detach().cpu().float().numpy()
  return np.asarray(value, np.float32)


def _to_flax(path: tuple, value: np.ndarray) -> np.ndarray:
  if path[-1] == 'kernel' and value.ndim == 4:
    return np.transpose(value, (2, 3, 1, 0))  # OIHW -> HWIO
  if path[-1] == 'kernel' and value.ndim == 2:
    return value.T  # Linear [out, in] -> Dense [in, out]
  return value


def clean_state_dict(state_dict: Mapping) -> dict:
  """Unwraps {'state_dict': ...} / {'model': ...} checkpoints and strips a DataParallel 'module.'."""
  for key in ('state_dict', 'model'):
    if key in state_dict and isinstance(state_dict[key], Mapping):
      state_dict = state_dict[key]
  return {(k[len('module.'):] if k.startswith('module.') else k): v for k, v in state_dict.items()}


def convert_state_dict(state_dict: Mapping, params_template: Mapping,
                       batch_stats_template: Mapping) -> tuple:
  """(params, batch_stats) with every leaf of the templates taken from `state_dict` (torchvision names),
  except `fc` when its shape differs; a WeightsError for a missing, unknown or mis-shaped key."""
  sd = {k: v for k, v in clean_state_dict(state_dict).items() if not k.endswith('num_batches_tracked')}
  used, missing, mismatched = set(), [], []
  result = {}
  for collection, template in (('params', params_template), ('batch_stats', batch_stats_template)):
    flat = {}
    for path, leaf in _flatten(template).items():
      name = torch_name(collection, path)
      want = tuple(np.shape(leaf))
      if path[0] == 'fc':
        used.add(name)
        if name in sd and _to_flax(path, _to_numpy(sd[name])).shape == want:
          flat[path] = jnp.asarray(_to_flax(path, _to_numpy(sd[name])))
        else:
          flat[path] = leaf  # classifier of another size: keep ours
        continue
      if name not in sd:
        missing.append(name)
        continue
      used.add(name)
      value = _to_flax(path, _to_numpy(sd[name]))
      if value.shape != want:
        mismatched.append(f'{name}: {tuple(np.shape(sd[name]))} in the file, {want} expected here '
                          f'(as {"/".join(path)})')
        continue
      flat[path] = jnp.asarray(value)
    result[collection] = _unflatten(flat)
  problems = [f'{len(names)} {what}: {sep.join(names[:n])}{" ..." if len(names) > n else ""}'
              for what, names, sep, n in (('missing', missing, ', ', 8), ('unexpected', sorted(set(sd) - used), ', ', 8),
                                          ('of another shape', mismatched, '; ', 4)) if names]
  if problems:
    raise WeightsError('the state dict does not match this ResNet (is it a torchvision resnet18 of the '
                       'same width?): ' + ' | '.join(problems))
  return result['params'], result['batch_stats']


def read_state_dict(pth_path) -> dict:
  """The state dict in a `.pth` file, read on the CPU with PyTorch (imported here, optional)."""
  path = os.path.expanduser(os.path.expandvars(str(pth_path)))
  if not os.path.isfile(path):
    raise WeightsError(
        f'pretrained weights {pth_path!r} not found{f" (expanded: {path})" if path != str(pth_path) else ""}. '
        f'Download torchvision\'s ImageNet ResNet-18 ({TORCHVISION_URL}) and point '
        '--config.model.pretrained (or F2M_CUB_PRETRAINED for configs/cub200.py) at it; '
        "--config.model.pretrained='' trains from a random init instead.")
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise WeightsError(f'reading {path} needs PyTorch, an optional extra of f2m_jax: pip install torch '
                       '(the CPU build is enough)') from e
  try:
    state = torch.load(path, map_location='cpu', weights_only=True)
  except Exception as e:  # pickle/zip errors of many types
    raise WeightsError(f'could not read {path} as a PyTorch state dict: {type(e).__name__}: {e}') from e
  if not isinstance(state, Mapping):
    raise WeightsError(f'{path} holds a {type(state).__name__}, not a state dict')
  return dict(state)


def load_torchvision_resnet18(pth_path, model, image_size: int,
                              key: Optional[jax.Array] = None) -> tuple:
  """(params, batch_stats) for `model` (our `resnet18`) from a torchvision ResNet-18 `.pth` file;
  `key` inits the templates (and the classifier where the file's has another size)."""
  state_dict = read_state_dict(pth_path)
  key = jax.random.key(0) if key is None else key
  init = jax.jit(lambda k: model.init(k, jnp.zeros((1, image_size, image_size, 3), jnp.float32), train=False))
  variables = init(key)
  return convert_state_dict(state_dict, variables['params'], variables['batch_stats'])


def to_state_dict(params: Mapping, batch_stats: Mapping) -> dict:
  """The inverse mapping: numpy arrays under torchvision names (for tests and export)."""
  out: dict[str, Any] = {}
  for collection, tree in (('params', params), ('batch_stats', batch_stats)):
    for path, leaf in _flatten(tree).items():
      value = np.asarray(leaf, np.float32)
      if path[-1] == 'kernel' and value.ndim == 4:
        value = np.transpose(value, (3, 2, 0, 1))
      elif path[-1] == 'kernel' and value.ndim == 2:
        value = value.T
      out[torch_name(collection, path)] = value
  return out
