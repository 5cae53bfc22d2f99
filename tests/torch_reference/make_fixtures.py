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
  sessions/*  from the base/noisy model after step 3: base prototypes; 2 runs of sessions 2-4 (2-way
              5-shot from a pool of 7 images per class), per session 6 full-batch steps on the shots
              seen so far, augmented (the augmented images stored), a fresh SGD, rounding and the
              clamp at bound_value BOUND_INC: losses, noise-set params, entries within NEAR of a
              rounding boundary, all prototypes, NCM predictions with PN on the test images.
  retry/*     one session where whole tensors round to zero and the doubled step is taken (`retried`).
  authors/*   the authors' CIFAR-100 values the transcription runs with (AUTHORS).
  std/*       torch.std's gradient on a pair of nearly equal values.
  sampler/*   level counts of 20,000 one-element DiscreteBeta draws and of 300 draws of a 1,000-element
              layer; one TaskSampler epoch.
"""
from __future__ import annotations

import copy
import os
import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import f2m_torch  # noqa: E402

FIXTURES = pathlib.Path(os.environ.get('F2M_FIXTURES_OUT') or pathlib.Path(__file__).resolve().parents[1] / 'fixtures')
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


# The authors' CIFAR-100 values the transcription runs with (their YAMLs); the tests build the JAX side
# from configs/cifar100.py and check that it holds the same values, so a changed default shows.
AUTHORS = {'base_lr': 0.1, 'momentum': 0.9, 'weight_decay': 5e-4, 'lr_gamma': 0.01, 'M': 2, 'std_weight': 2.0,
           'pf_weight': 1.0, 'inc_lr': 0.01, 'inc_steps': 6, 'num_layers': 4, 'bound_value': 0.01}
MILESTONE = 2  # the base schedule's milestone, scaled to the fixture's 3 steps (theirs: 15,000 of 30,003)
# The sessions' bound: small enough that the rounding and the clamp both act at this model's gradient
# scale (at CIFAR's 0.01 nearly every step of this width-3 net rounds to zero).
BOUND_INC = 4e-4
NEAR = 1e-3  # |frac(lr g / factor) - 1/2| below this: a rounding boundary within float error
SESSIONS, NOVEL_WAYS, INC_SHOTS, POOL, TEST_PER_CLASS, BASE_PER_CLASS, RUNS = (2, 3, 4), 2, 5, 7, 3, 4, 2


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
         'meta/lr': DTYPE(AUTHORS['base_lr']), 'meta/dtype': np.asarray(str(np.dtype(DTYPE))),
         'meta/milestone': np.int32(MILESTONE)}
  out.update({f'authors/{k}': np.float64(v) for k, v in AUTHORS.items()})

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
  opts = {mode: torch.optim.SGD(n.parameters(), lr=AUTHORS['base_lr'], momentum=AUTHORS['momentum'],
                                weight_decay=AUTHORS['weight_decay']) for mode, n in nets.items()}
  # Their MultiStepRestartLR steps once per iteration: iterations from MILESTONE on run at lr x gamma.
  scheds = {mode: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[MILESTONE], gamma=AUTHORS['lr_gamma'])
            for mode, o in opts.items()}
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
      scheds[mode].step()
      if t == 0:
        out[f'base/{mode}/step0/loss'] = DTYPE(loss)
        out.update({f'base/{mode}/step0/grads/{jax_path(k)}': to_jax(k, g) for k, g in grads.items()})
        out.update(stats_of(n, f'base/{mode}/step0/batch_stats'))
  for mode, n in nets.items():
    out.update(params_of(n, f'base/{mode}/step2/params'))
    out.update(stats_of(n, f'base/{mode}/step2/batch_stats'))

  sessions(out, nets['noisy'], names, rng)

  # torch.std's gradient on two nearly equal losses (PyTorch's formula keeps the rounding of x - mean).
  pair = torch.tensor([1.7914095, 1.7914089], requires_grad=True)
  torch.std(pair).backward()
  out['std/x'] = pair.detach().numpy()
  out['std/grad'] = pair.grad.numpy()

  # The sampler: level counts of one-element draws (each its own alpha, beta) and a TaskSampler epoch.
  one = f2m_torch.DiscreteBeta((1,), BOUND_VALUE)
  levels = torch.cat([f2m_torch.level_indices(one.sample(), BOUND_VALUE) for _ in range(20000)])
  out['sampler/level_counts'] = np.bincount(levels.numpy(), minlength=5).astype(np.int64)
  # Whole-layer draws: alpha and beta are drawn once per layer and draw, so the level frequencies of
  # one draw vary from draw to draw far more than with a pair per element.
  layer = f2m_torch.DiscreteBeta((1000,), BOUND_VALUE)
  out['sampler/layer_level_counts'] = np.stack([
      np.bincount(f2m_torch.level_indices(layer.sample(), BOUND_VALUE).numpy(), minlength=5) for _ in range(300)])
  labels = np.repeat(np.arange(60), 20)
  batches = f2m_torch.task_sampler_epoch(labels, 16, 256)
  out['sampler/epoch_labels'] = np.asarray([labels[b] for b in batches], np.int16)
  out['sampler/epoch_indices'] = np.asarray(batches, np.int16)

  os.makedirs(path.parent, exist_ok=True)
  np.savez_compressed(path, **out)
  print(f'wrote {path} ({path.stat().st_size / 1024:.0f} KB, torch {torch.__version__})')
  print('sessions: entries within NEAR of a rounding boundary at some step:',
        sum(int(v.sum()) for k, v in out.items() if k.endswith('/near_boundary') or '/near_boundary/' in k))


def sessions(out: dict, base_net, names, rng) -> None:
  """sessions/*: their incremental procedure (MTNBModel) from the base model `base_net`, RUNS runs of
  the sessions SESSIONS, NOVEL_WAYS-way INC_SHOTS-shot: base prototypes; per run and session the
  shots drawn from each class's pool, 6 full-batch steps over all shots seen so far (augmented by
  crop_flip, the augmented images stored so both sides see them), a fresh SGD per session, the steps
  rounded and clamped to phi* +- b, the network carried to the run's next session; then the novel
  prototypes recomputed and NCM with PN on the test images of all seen classes. retry/*: one more
  session at a bound where the doubled-step retry fires."""
  classes = CLASSES + NOVEL_WAYS * len(SESSIONS)
  base_images = rng.integers(0, 256, (CLASSES * BASE_PER_CLASS, SIZE, SIZE, 3), dtype=np.uint8)
  base_labels = np.repeat(np.arange(CLASSES), BASE_PER_CLASS)
  novel = np.arange(CLASSES, classes)
  pool_images = rng.integers(0, 256, (len(novel) * POOL, SIZE, SIZE, 3), dtype=np.uint8)
  pool_labels = np.repeat(novel, POOL)
  test_images = rng.integers(0, 256, (classes * TEST_PER_CLASS, SIZE, SIZE, 3), dtype=np.uint8)
  test_labels = np.repeat(np.arange(classes), TEST_PER_CLASS)
  out.update({'sessions/base_images': base_images, 'sessions/base_labels': base_labels.astype(np.int32),
              'sessions/pool_images': pool_images, 'sessions/pool_labels': pool_labels.astype(np.int32),
              'sessions/test_images': test_images, 'sessions/test_labels': test_labels.astype(np.int32),
              'sessions/bound_value': DTYPE(BOUND_INC)})
  base_state = copy.deepcopy(base_net.state_dict())
  base_protos = f2m_torch.class_prototypes(base_net, inputs(base_images), base_labels, range(CLASSES))
  out['sessions/base_prototypes'] = base_protos.numpy().astype(DTYPE)
  seen = CLASSES
  predictions = f2m_torch.ncm_predictions(base_net, inputs(test_images[test_labels < seen]), base_protos)
  out['sessions/session1/predictions'] = predictions.numpy().astype(np.int32)

  def run_session(net, params, anchors, shots, bound_value, prefix, record_near=True):
    """One session of their procedure on the exemplar indices `shots` (into the pool)."""
    opt = torch.optim.SGD(params, lr=AUTHORS['inc_lr'], momentum=AUTHORS['momentum'],
                          weight_decay=AUTHORS['weight_decay'])  # a fresh optimizer every session
    near = [torch.zeros_like(p, dtype=torch.bool) for p in params]
    losses, retried = [], []
    for k in range(int(AUTHORS['inc_steps'])):
      images = f2m_torch.crop_flip(pool_images[shots], rng)
      out[f'{prefix}/step{k}/images'] = images
      loss, ratios, tried = f2m_torch.incremental_step(net, opt, inputs(images), base_protos, INC_SHOTS, params,
                                                       anchors, bound_value, AUTHORS['inc_lr'])
      losses.append(loss)
      retried.append(tried)
      for i, r in enumerate(ratios):
        for mult in (1.0, 2.0):  # the doubled retry rounds 2 * ratio
          frac = torch.abs(r * mult) - torch.floor(torch.abs(r * mult))
          near[i] |= torch.abs(frac - 0.5) < NEAR
    out[f'{prefix}/losses'] = np.asarray(losses, DTYPE)
    out[f'{prefix}/retried'] = np.asarray(retried, bool)
    for k, p, m in zip(names, params, near):
      out[f'{prefix}/params/{jax_path(k)}'] = to_jax(k, p)
      out[f'{prefix}/near_boundary/{jax_path(k)}'] = to_jax(k, m.float()).astype(bool)

  def trainable(net):
    net.eval()
    for p in net.parameters():
      p.requires_grad_(False)
    params = [p for _, p in f2m_torch.noise_set(net, NUM_LAYERS)]
    for p in params:
      p.requires_grad_(True)
    return params, [p.detach().clone() for p in params]

  for run in range(RUNS):
    base_net.load_state_dict(base_state)  # every run starts from phi*
    params, anchors = trainable(base_net)
    shots = np.zeros((0,), np.int64)
    for session in SESSIONS:
      new = novel[(session - 2) * NOVEL_WAYS:(session - 1) * NOVEL_WAYS]
      drawn = [np.sort(rng.choice(np.flatnonzero(pool_labels == c), INC_SHOTS, replace=False)) for c in new]
      shots = np.concatenate([shots, *drawn])  # class-contiguous, classes in order
      prefix = f'sessions/run{run}/session{session}'
      out[f'{prefix}/shots'] = shots.astype(np.int32)
      run_session(base_net, params, anchors, shots, BOUND_INC, prefix)
      seen = CLASSES + NOVEL_WAYS * (session - 1)
      novel_protos = f2m_torch.class_prototypes(base_net, inputs(pool_images[shots]), pool_labels[shots],
                                                novel[:seen - CLASSES])
      protos = torch.cat([base_protos, novel_protos])
      out[f'{prefix}/prototypes'] = protos.numpy().astype(DTYPE)
      predictions = f2m_torch.ncm_predictions(base_net, inputs(test_images[test_labels < seen]), protos)
      out[f'{prefix}/predictions'] = predictions.numpy().astype(np.int32)

  # The retry: the bound chosen so that one noise-set tensor's largest |lr g| / factor at the first
  # step is 0.4 (all of it rounds to zero, the doubled step does not): run 0's session-2 shots.
  base_net.load_state_dict(base_state)
  params, anchors = trainable(base_net)
  shots = out['sessions/run0/session2/shots']
  probe = copy.deepcopy(base_net)
  probe_params = [p for _, p in f2m_torch.noise_set(probe, NUM_LAYERS)]
  x = inputs(f2m_torch.crop_flip(pool_images[shots], np.random.default_rng(0)))
  emb, _ = probe.forward_o_embeddings(x)
  ways = emb.shape[0] // INC_SHOTS
  protos = torch.cat([emb.reshape(ways, INC_SHOTS, -1).mean(dim=1), base_protos])
  loss = F.cross_entropy(-((emb[:, None] - protos[None]) ** 2).sum(dim=2), torch.arange(ways).repeat_interleave(INC_SHOTS))
  grads = torch.autograd.grad(loss, probe_params)
  smallest = min(float((g * AUTHORS['inc_lr']).abs().max()) for g in grads)
  bound_value = 4 * smallest / 0.4  # factor = bound_value / 4, so that tensor's largest ratio is 0.4
  out['retry/bound_value'] = DTYPE(bound_value)
  out['retry/shots'] = shots
  run_session(base_net, params, anchors, shots, bound_value, 'retry')
  print(f'retry: bound_value {bound_value:.3g}, retried (step x tensor):', out['retry/retried'].astype(int).tolist())


if __name__ == '__main__':
  main()
