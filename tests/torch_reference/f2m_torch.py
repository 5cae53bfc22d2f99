"""A small PyTorch transcription of what the authors' F2M code computes (test-only, never imported by
the package; `make_fixtures.py` runs it to write the fixtures the JAX tests compare with).

Written from reading the public repository moukamisama/F2M at 7b2ebac (files named per function),
not copied from it. Where
their code has a quirk, this transcription keeps it, because the point is to hold our JAX code to
what their PyTorch code really computes:
  - the DiscreteBeta sampler with its in-place bin relabelling (utils/utils.py);
  - the noise added to `p.data` and restored *before* backward, so the input gradient through a
    noised conv uses the clean weight (methods/F2M_model.py, optimize_parameters);
  - prototype fixing as a Python float (`.item()`), so it has no gradient (methods/losses/losses.py);
  - the loss: mean over the M noisy losses plus 2 * their unbiased std;
  - train-mode BatchNorm in the clean pass and in every noisy pass (1 + M running-stat updates);
  - the TaskSampler epoch (data/task_sampler.py) behind a DataLoader with drop_last;
  - the incremental step: eval-mode BN, Eq. 5 with squared distances and batch prototypes first,
    the step rounding to multiples of bound_value / reduction_factor with one doubled retry, torch
    SGD, then the clamp to phi* +- bound_value / 2 (methods/mt_nb_model.py, methods/base_model.py);
  - the rest of a session: torchvision's RandomCrop(padding=4) + flip, prototypes in eval mode, NCM
    with unit-norm prototypes (utils.pnorm) and raw queries.
Shapes follow PyTorch (NCHW, OIHW); the fixture writer converts to the JAX layout.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


# ---------------------------------------------------------------------------------------------
# ResNet-20 (methods/archs/resnet20_cifar_arch.py: Resnet20_cifar_small), with a width knob so the
# fixtures stay small. Parameter registration order matches theirs, which decides the noise set.
class Block(nn.Module):
  def __init__(self, cin, cout, stride):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(cout)
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.bn2 = nn.BatchNorm2d(cout)
    self.downsample = None
    if stride != 1 or cin != cout:
      self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

  def forward(self, x):
    out = F.relu(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    shortcut = x if self.downsample is None else self.downsample(x)
    return F.relu(out + shortcut)


class ResNet20(nn.Module):
  def __init__(self, num_classes, width=16):
    super().__init__()
    w = (width, 2 * width, 4 * width)
    self.conv1 = nn.Conv2d(3, w[0], 3, 1, 1, bias=False)
    self.bn1 = nn.BatchNorm2d(w[0])
    stages, cin = [], w[0]
    for i, cout in enumerate(w):
      blocks = []
      for j in range(3):
        blocks.append(Block(cin, cout, 2 if (i > 0 and j == 0) else 1))
        cin = cout
      stages.append(nn.Sequential(*blocks))
    self.layer1, self.layer2, self.layer3 = stages
    self.fc = nn.Linear(w[2], num_classes)
    for m in self.modules():
      if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
      elif isinstance(m, nn.BatchNorm2d):
        nn.init.constant_(m.weight, 1)
        nn.init.constant_(m.bias, 0)
    nn.init.normal_(self.fc.weight, std=0.001)
    nn.init.constant_(self.fc.bias, 0)

  def forward_o_embeddings(self, x):
    x = F.relu(self.bn1(self.conv1(x)))
    x = self.layer3(self.layer2(self.layer1(x)))
    emb = x.mean(dim=(2, 3))
    return emb, self.fc(emb)


def noise_set(net, num_layers):
  """Their 'suffix_conv_weight' selection: names ending in 'weight', containing 'conv', not
  'shortcut', in registration order; the last num_layers."""
  named = [(k, v) for k, v in net.named_parameters()
           if k.endswith('weight') and 'conv' in k and 'shortcut' not in k]
  return named[-num_layers:]


# ---------------------------------------------------------------------------------------------
# The DiscreteBeta sampler (utils/utils.py: DiscreteBetaDistribution).
BETA_SHAPES = [0.3, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0]


class DiscreteBeta:
  def __init__(self, shape, bound_value, reduction_factor=4):
    k = int(reduction_factor / 2)
    self.choice = torch.arange(-k, k + 1) / reduction_factor * bound_value
    self.anchors = torch.arange(len(self.choice) + 1) / len(self.choice)
    self.shape = shape

  def sample(self):
    alpha = BETA_SHAPES[np.random.randint(7)]
    beta = BETA_SHAPES[np.random.randint(7)]
    u = torch.distributions.Beta(torch.full(self.shape, alpha), torch.full(self.shape, beta)).sample()
    # The in-place labelling, one bin after another: a value labelled 1 by the second bin lies in
    # the last bin's interval [0.8, 1] and is relabelled 4 when that bin's turn comes.
    for i in range(len(self.anchors) - 1):
      inside = torch.logical_and(u >= self.anchors[i], u <= self.anchors[i + 1])
      u[inside] = i
    return self.choice[u.long()]


def level_indices(noise, bound_value, reduction_factor=4):
  """Noise values -> indices 0..4 of the five grid levels (for counting)."""
  return torch.round(noise / bound_value * reduction_factor).long() + reduction_factor // 2


# ---------------------------------------------------------------------------------------------
# The TaskSampler epoch behind a DataLoader(batch_size, shuffle=False, drop_last=True).
def task_sampler_epoch(labels, num_samples, batch_size):
  index_dic = {}
  for index, label in enumerate(labels):
    index_dic.setdefault(int(label), []).append(index)
  keys = list(index_dic)
  blocks = []
  for cl in torch.randperm(len(keys)):
    members = torch.tensor(index_dic[keys[int(cl)]])
    blocks.append(members[torch.randperm(len(members))[:num_samples]])
  order = torch.stack(blocks).reshape(-1)
  n = len(order) // batch_size
  return [order[b * batch_size:(b + 1) * batch_size].numpy() for b in range(n)]


# ---------------------------------------------------------------------------------------------
# Base step (methods/F2M_model.py: optimize_parameters, with ProtoFixLoss).
def proto_fix_value(clean, noisy, shots, w=1.0):
  ways = clean.shape[0] // shots
  p = clean.reshape(ways, shots, -1).mean(dim=1)
  q = noisy.reshape(ways, shots, -1).mean(dim=1)
  return ((p - q) ** 2).sum(dim=1).mean().item() * w  # a float: no gradient


def base_step(net, optimizer, x, y, noises, shots, restore_before_backward=True):
  """One iteration. noises: list over the M draws of lists over the noise set (OIHW tensors).

  restore_before_backward=True is their code: the noise goes into p.data and is taken out again
  before backward, so the input gradient through a noised conv uses the clean weight.
  False gives the exact gradient (each draw's weights as a differentiable p + e), for the switch."""
  named = noise_set(net, len(noises[0]))
  params = [p for _, p in named]
  optimizer.zero_grad()
  clean_emb, _ = net.forward_o_embeddings(x)
  saved = [p.clone() for p in params]
  total, per_draw = 0.0, []
  for draw in noises:
    if restore_before_backward:
      for p, e in zip(params, draw):
        p.data = p.data + e
      emb, logits = net.forward_o_embeddings(x)
      for p, s in zip(params, saved):
        p.data = s.data
    else:
      weights = {f'net.{k}': p + e for (k, p), e in zip(named, draw)}
      emb, logits = torch.func.functional_call(Embeddings(net), weights, (x,), strict=False)
    ce = F.cross_entropy(logits, y)
    pf = proto_fix_value(clean_emb, emb, shots)
    total = total + ce + pf
    per_draw.append(ce + pf)
  total = total / len(noises) + 2.0 * torch.std(torch.stack(per_draw))
  total.backward()
  grads = {k: v.grad.detach().clone() for k, v in net.named_parameters()}
  optimizer.step()
  return float(total.detach()), grads


class Embeddings(nn.Module):
  """net.forward_o_embeddings as a module's forward (for torch.func.functional_call)."""

  def __init__(self, net):
    super().__init__()
    self.net = net

  def forward(self, x):
    return self.net.forward_o_embeddings(x)


# ---------------------------------------------------------------------------------------------
# Incremental step (methods/mt_nb_model.py: incremental_optimize_parameters and
# IncrementalPTFixPNLoss; methods/base_model.py: clamp_range_params).
def incremental_step(net, optimizer, x, base_prototypes, shots, params, anchors, bound_value, lr,
                     reduction_factor=4, max_steps=1):
  """One step on the class-contiguous batch x (ways blocks of `shots` images, novel classes in order).
  Returns (loss, ratios, retried): ratios[i] is lr * grad / factor of params[i] before rounding,
  retried[i] whether params[i] rounded to all zeros and took the doubled step."""
  optimizer.zero_grad()
  net.eval()
  emb, _ = net.forward_o_embeddings(x)
  ways = emb.shape[0] // shots
  novel = emb.reshape(ways, shots, -1).mean(dim=1)
  protos = torch.cat([novel, base_prototypes], dim=0)
  logits = -((emb[:, None, :] - protos[None, :, :]) ** 2).sum(dim=2)
  labels = torch.arange(ways).repeat_interleave(shots)
  loss = F.cross_entropy(logits, labels)
  loss.backward()
  factor = bound_value / reduction_factor
  ratios, retried = [], []
  for p in params:
    ratios.append((p.grad * lr / factor).detach().clone())
    q = torch.round(p.grad * lr / factor)
    n = 1
    while n <= max_steps and bool((q == 0).all()):
      n += 1
      q = torch.round(p.grad * lr * n / factor)
    retried.append(n > 1)
    p.grad = q * factor / lr
  optimizer.step()
  with torch.no_grad():
    for p, a in zip(params, anchors):
      upper, lower = a + bound_value / 2, a - bound_value / 2
      p.data[p.data > upper] = upper[p.data > upper]
      p.data[p.data < lower] = lower[p.data < lower]
  return float(loss.detach()), ratios, retried


# ---------------------------------------------------------------------------------------------
# The rest of an incremental session (methods/mt_nb_model.py: incremental_update, the NCM test;
# torchvision's RandomCrop(32, padding=4) + RandomHorizontalFlip on uint8 images).
def crop_flip(images_u8, rng, pad=4):
  """RandomCrop(size, padding=pad) with black padding, then a horizontal flip with p = 0.5, per
  image, drawn from the numpy Generator `rng`."""
  n, h, w, _ = images_u8.shape
  padded = np.pad(images_u8, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
  out = np.empty_like(images_u8)
  for i in range(n):
    dy, dx = rng.integers(0, 2 * pad + 1, size=2)
    crop = padded[i, dy:dy + h, dx:dx + w]
    out[i] = crop[:, ::-1] if rng.random() < 0.5 else crop
  return out


@torch.no_grad()
def class_prototypes(net, x, labels, classes):
  """Eq. 1 in eval mode (the test transform): the mean embedding of each class, in `classes` order."""
  net.eval()
  emb, _ = net.forward_o_embeddings(x)
  return torch.stack([emb[torch.as_tensor(labels) == c].mean(dim=0) for c in classes])


@torch.no_grad()
def ncm_predictions(net, x, prototypes, normalize=True):
  """Their NCM test: prototypes scaled to unit L2 norm (utils.pnorm), raw queries, argmin of the
  squared Euclidean distance."""
  net.eval()
  emb, _ = net.forward_o_embeddings(x)
  p = prototypes / prototypes.norm(dim=1, keepdim=True) if normalize else prototypes
  return ((emb[:, None, :] - p[None, :, :]) ** 2).sum(dim=2).argmin(dim=1)
