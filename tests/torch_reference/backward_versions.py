"""Which gradient does the authors' base step compute on the installed PyTorch?

    python tests/torch_reference/backward_versions.py      # any torch from 1.8 on, Python 3.8+

Runs the transcription's base step with their `p.data` reassignment (f2m_torch.base_step with
restore_before_backward=True: the noise put into p.data, the forward pass, p.data restored, then one
backward) on the float64 fixture's weights, batch and noise, and compares every gradient with the
fixture's two references, written with a current PyTorch: base/clean (the noisy passes
differentiated at the restored clean weights) and base/noisy (at the noisy weights, the exact
gradient). Then the mechanism on one convolution: the input gradient after the restore, against
the clean-weight and the noisy-weight input gradients.

PyTorch <= 1.9 saved a leaf for backward as a shallow copy of its data at save time, so the restore
did not reach it; from 1.10 (pytorch/pytorch#59837, fixing #58500) a leaf is saved by reference and
the backward sees the restored weights. Results of this script: experiments/results/pytorch_backward/.
"""
import pathlib
import sys

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import f2m_torch  # noqa: E402

torch.set_default_dtype(torch.float64)
fx = dict(np.load(HERE.parent / 'fixtures' / 'torch_f2m_f64.npz'))
WIDTH, CLASSES = 3, 6
net = f2m_torch.ResNet20(CLASSES, WIDTH); net.train()

def jax_path(name):
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

def to_torch(a):
  a = np.asarray(a, np.float64)
  if a.ndim == 4: a = a.transpose(3, 2, 0, 1)
  elif a.ndim == 2: a = a.T
  return torch.from_numpy(a.copy())

with torch.no_grad():
  for k, p in net.named_parameters(): p.copy_(to_torch(fx['base/init/params/' + jax_path(k)]))
  for k, b in net.named_buffers():
    if 'running' in k: b.copy_(to_torch(fx['base/init/batch_stats/' + jax_path(k)]))
names = [k for k, _ in f2m_torch.noise_set(net, 4)]
bv = float(fx['meta/bound_value'])
levels = (np.arange(5) - 2) / 4 * bv
noises = [[to_torch(levels[fx[f'base/step0/noise{j}/' + jax_path(k)]]) for k in names] for j in range(2)]
images = fx['base/step0/images']
x = torch.from_numpy(((images / 255.0 - np.asarray([0.5071, 0.4866, 0.4409])) / np.asarray([0.2009, 0.1984, 0.2023])).transpose(0, 3, 1, 2).copy())
y = torch.from_numpy(fx['base/step0/labels'].astype(np.int64))
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
loss, grads = f2m_torch.base_step(net, opt, x, y, noises, 4, restore_before_backward=True)
print(f'torch {torch.__version__}: loss {loss:.15f}')
for ref in ('clean', 'noisy'):
  worst, where = 0.0, ''
  for k, g in grads.items():
    want = to_torch(fx[f'base/{ref}/step0/grads/' + jax_path(k)])
    e = float((g - want).abs().max() / want.abs().max())
    if e > worst: worst, where = e, k
  print(f'  gradients vs base/{ref}: worst relative error {worst:.2e} ({where})')

# The mechanism on one conv: y = conv(x, w + e) through p.data, restored before backward.
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4, 3, 3, 3)); xin = torch.randn(2, 3, 8, 8, requires_grad=True)
clean = w.data; e = 0.5 * torch.randn_like(w)
w.data = w.data + e
out = torch.nn.functional.conv2d(xin, w, padding=1)
w.data = clean
r = torch.randn_like(out)
(out * r).sum().backward()
gx_saved = xin.grad.clone()
for weight, name in ((clean, 'clean'), (clean + e, 'noisy')):
  xi = xin.detach().clone().requires_grad_(True)
  o = torch.nn.functional.conv2d(xi, weight, padding=1)
  g, = torch.autograd.grad((o * r).sum(), xi)
  print(f'  one conv: input gradient after the restore equals the {name}-weight gradient: {torch.allclose(gx_saved, g, rtol=1e-12, atol=0)}')
