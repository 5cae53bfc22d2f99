"""Writes tests/fixtures/torch_f2m.npz (float32) and torch_f2m_f64.npz (float64) from the PyTorch
transcription (f2m_torch.py).

    pip install torch==2.13.0      # any recent CPU build
    python tests/torch_reference/make_fixtures.py

CI does not run this: it only reads the committed .npz files (tests/test_torch_fixtures.py). Everything is
seeded, so a rerun with the same torch build rewrites the same file.

Contents (JAX layout: NHWC images, HWIO kernels; parameter paths joined by '/'):
  base/*      a width-3 ResNet-20 with 6 classes, 3 base steps on 16 images of 16x16 (4 classes x
              4 shots, class-contiguous) with explicit DiscreteBeta noise (M = 2, bound_value 0.4, see BOUND_VALUE):
              initial params and BN statistics, the images (already augmented, uint8) and labels,
              the noise; then for each backward, base/clean/* (their code on PyTorch >= 1.10: the
              noisy passes differentiated at the restored clean weights) and base/noisy/* (<= 1.9:
              at the noisy weights), the loss and every gradient of step 1, the BN statistics after
              step 1, params and BN statistics after step 3.
  inc/*       3 incremental steps from the base/clean model after step 3: 2 novel classes x 5 shots,
              stored base prototypes, lr 0.01, rounding on, clamp on: the losses, the noise-set
              params after step 3, and which entries came within NEAR of a rounding boundary.
  std/*       torch.std's gradient on a pair of nearly equal values.
  sampler/*   level counts of 20,000 one-element DiscreteBeta draws; one TaskSampler epoch.
"""
from __future__ import annotations

import copy
import os
import pathlib
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import f2m_torch  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / 'fixtures'
# The same computations in float32 (what runs) and in float64 (what the equivalence tests hold us to
# with margins of orders of magnitude, on any CPU: float32 sums in another order differ by more than a
# fixed tolerance can promise after a few steps at lr 0.1).
OUTPUTS = {torch.float32: FIXTURES / 'torch_f2m.npz', torch.float64: FIXTURES / 'torch_f2m_f64.npz'}
MEAN = [0.5071, 0.4866, 0.4409]
STD = [0.2009, 0.1984, 0.2023]
DTYPE = np.float32  # set per output by write()
WIDTH, CLASSES, SIZE = 3, 6, 16
WAYS, SHOTS, M, NUM_LAYERS = 4, 4, 2, 4
# Their config value (noise and clamp reach BOUND_VALUE / 2), much larger than CIFAR's 0.01 on
# purpose: the std term's gradient is (L_j - mean) / ((M - 1) std), so float32 rounding of the M
# losses (an ulp, 1e-7) reaches the whole gradient amplified by 1 / std. At CIFAR's bound the M
# losses of this small net differ by about 3e-4 and an ulp of difference between two correct
# implementations moves every gradient by 1e-3; with this bound they differ by about 1e-2 and
# float32 agreement to 1e-5 is meaningful.
BOUND_VALUE = 0.4


BOUND_INC = float(os.environ.get('BOUND_INC', '4e-4'))
NEAR = 1e-3  # |frac(lr g / factor) - 1/2| below this: a rounding boundary within float error


def jax_path(name: str) -> str:
  """Torch parameter/buffer name -> our flat path ('layer3.1.conv1.weight' -> 'layer3_1/conv1/kernel')."""
  parts = name.split('.')
  if parts[0].startswith('layer'):
    parts = [f'{parts[0]}_{parts[1]}'] + parts[2:]
  if 'downsample' in parts:
    i = parts.index('downsample')
    parts = parts[:i] + [{'0': 'downsample_conv', '1': 'downsample_bn'}[parts[i + 1]]] + parts[i + 2:]
  leaf = parts[-1]
  is_conv = parts[-2].startswith('conv') or parts[-2] == 'downsample_conv'
  parts[-1] = {'weight': 'kernel' if (is_conv or parts[-2] == 'fc') else 'scale', 'bias': 'bias',
               'running_mean': 'mean', 'running_var': 'var'}[leaf]
  return '/'.join(parts)


def to_jax(name: str, t: torch.Tensor) -> np.ndarray:
  a = t.detach().cpu().numpy().astype(DTYPE)
  if a.ndim == 4:
    return a.transpose(2, 3, 1, 0)  # OIHW -> HWIO
  if a.ndim == 2:
    return a.T  # Linear [out, in] -> Dense kernel [in, out]
  return a


def params_of(net, prefix: str) -> dict:
  return {f'{prefix}/{jax_path(k)}': to_jax(k, v) for k, v in net.named_parameters()}


def stats_of(net, prefix: str) -> dict:
  return {f'{prefix}/{jax_path(k)}': to_jax(k, v) for k, v in net.named_buffers() if 'running' in k}


def inputs(images_u8: np.ndarray) -> torch.Tensor:
  """ToTensor + Normalize of HWC uint8 images -> NCHW in the fixture's dtype."""
  x = (images_u8.astype(DTYPE) / DTYPE(255.0) - np.asarray(MEAN, DTYPE)) / np.asarray(STD, DTYPE)
  return torch.from_numpy(x.transpose(0, 3, 1, 2).copy())


def main() -> None:
  for dtype, path in OUTPUTS.items():
    write(dtype, path)


def write(dtype, path: pathlib.Path) -> None:
  global DTYPE
  DTYPE = {torch.float32: np.float32, torch.float64: np.float64}[dtype]
  torch.set_default_dtype(dtype)
  torch.manual_seed(0)
  np.random.seed(0)
  rng = np.random.default_rng(0)
  out = {'meta/bound_value': DTYPE(BOUND_VALUE), 'meta/shots': np.int32(SHOTS), 'meta/M': np.int32(M),
         'meta/lr': DTYPE(0.1), 'meta/dtype': np.asarray(str(np.dtype(DTYPE)))}

  net = f2m_torch.ResNet20(CLASSES, WIDTH)
  net.train()
  out.update(params_of(net, 'base/init/params'))
  out.update(stats_of(net, 'base/init/batch_stats'))
  names = [k for k, _ in f2m_torch.noise_set(net, NUM_LAYERS)]
  out['base/noise_names'] = np.asarray([jax_path(k) for k in names])
  samplers = [f2m_torch.DiscreteBeta(p.shape, BOUND_VALUE) for _, p in f2m_torch.noise_set(net, NUM_LAYERS)]
  # Their step under both of PyTorch's behaviours (f2m_torch.base_step): 'clean' (>= 1.10: the noisy
  # passes' backward sees the restored clean weights) and 'noisy' (<= 1.9: the exact gradient at the
  # noisy weights), on the same batches and noise.
  nets = {'clean': net, 'noisy': copy.deepcopy(net)}
  opts = {mode: torch.optim.SGD(n.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4) for mode, n in nets.items()}
  for t in range(3):
    images = rng.integers(0, 256, (WAYS * SHOTS, SIZE, SIZE, 3), dtype=np.uint8)
    classes = rng.permutation(CLASSES)[:WAYS]
    labels = np.repeat(classes, SHOTS).astype(np.int32)
    noises = [[s.sample() for s in samplers] for _ in range(M)]
    out[f'base/step{t}/images'] = images
    out[f'base/step{t}/labels'] = labels
    for j, draw in enumerate(noises):  # stored as level indices 0..4 (values (index - 2) / 4 * bound_value)
      for k, e in zip(names, draw):
        out[f'base/step{t}/noise{j}/{jax_path(k)}'] = to_jax(k, f2m_torch.level_indices(e, BOUND_VALUE)).astype(np.int8)
    x, y = inputs(images), torch.from_numpy(labels.astype(np.int64))
    for mode, n in nets.items():
      loss, grads = f2m_torch.base_step(n, opts[mode], x, y, noises, SHOTS, restore_before_backward=mode == 'clean')
      if t == 0:
        out[f'base/{mode}/step0/loss'] = DTYPE(loss)
        out.update({f'base/{mode}/step0/grads/{jax_path(k)}': to_jax(k, g) for k, g in grads.items()})
        out.update(stats_of(n, f'base/{mode}/step0/batch_stats'))
  for mode, n in nets.items():
    out.update(params_of(n, f'base/{mode}/step2/params'))
    out.update(stats_of(n, f'base/{mode}/step2/batch_stats'))

  # Incremental steps on the base model after step 3 (their MTNBModel: only the noise set trains).
  net.eval()
  for p in net.parameters():
    p.requires_grad_(False)
  params = [p for _, p in f2m_torch.noise_set(net, NUM_LAYERS)]
  for p in params:
    p.requires_grad_(True)
  anchors = [p.detach().clone() for p in params]
  with torch.no_grad():
    base_imgs = rng.integers(0, 256, (CLASSES * 3, SIZE, SIZE, 3), dtype=np.uint8)
    emb, _ = net.forward_o_embeddings(inputs(base_imgs))
    base_protos = emb.reshape(CLASSES, 3, -1).mean(dim=1)
  out['inc/base_prototypes'] = base_protos.numpy()
  inc_ways, inc_shots, lr = 2, 5, 0.01
  # A bound small enough that the rounding and the clamp both act at this model's gradient scale.
  bound_value = BOUND_INC
  out['inc/bound_value'] = DTYPE(bound_value)
  out['inc/lr'] = DTYPE(lr)
  inc_opt = torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=5e-4)
  near = [torch.zeros_like(p, dtype=torch.bool) for p in params]
  losses = []
  for t in range(3):
    images = rng.integers(0, 256, (inc_ways * inc_shots, SIZE, SIZE, 3), dtype=np.uint8)
    out[f'inc/step{t}/images'] = images
    loss, ratios = f2m_torch.incremental_step(net, inc_opt, inputs(images), base_protos, inc_shots, params,
                                              anchors, bound_value, lr)
    losses.append(loss)
    if t == 0:
      r = torch.cat([x.reshape(-1) for x in ratios]).abs()
      print(f'incremental step 1: |lr g| / factor median {r.median():.3f}, rounded to nonzero {(r >= 0.5).float().mean():.2%}')
    for i, r in enumerate(ratios):
      for mult in (1.0, 2.0):  # the doubled retry rounds 2 * ratio
        frac = torch.abs(r * mult) - torch.floor(torch.abs(r * mult))
        near[i] |= torch.abs(frac - 0.5) < NEAR
  out['inc/losses'] = np.asarray(losses, DTYPE)
  for k, p, a, m in zip(names, params, anchors, near):
    out[f'inc/final/{jax_path(k)}'] = to_jax(k, p)
    out[f'inc/near_boundary/{jax_path(k)}'] = to_jax(k, m.float()).astype(bool)

  # torch.std's gradient on two nearly equal losses (PyTorch's formula keeps the rounding of x - mean).
  pair = torch.tensor([1.7914095, 1.7914089], requires_grad=True)
  torch.std(pair).backward()
  out['std/x'] = pair.detach().numpy()
  out['std/grad'] = pair.grad.numpy()

  # The sampler: level counts of one-element draws (each its own alpha, beta) and a TaskSampler epoch.
  one = f2m_torch.DiscreteBeta((1,), BOUND_VALUE)
  levels = torch.cat([f2m_torch.level_indices(one.sample(), BOUND_VALUE) for _ in range(20000)])
  out['sampler/level_counts'] = np.bincount(levels.numpy(), minlength=5).astype(np.int64)
  labels = np.repeat(np.arange(60), 20)
  batches = f2m_torch.task_sampler_epoch(labels, 16, 256)
  out['sampler/epoch_labels'] = np.asarray([labels[b] for b in batches], np.int16)
  out['sampler/epoch_indices'] = np.asarray(batches, np.int16)

  os.makedirs(path.parent, exist_ok=True)
  np.savez_compressed(path, **out)
  print(f'wrote {path} ({path.stat().st_size / 1024:.0f} KB, torch {torch.__version__})')
  print('incremental: entries within NEAR of a rounding boundary at some step:',
        sum(int(v.sum()) for k, v in out.items() if k.startswith('inc/near_boundary/')))


if __name__ == '__main__':
  main()
