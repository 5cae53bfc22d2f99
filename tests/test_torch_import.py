"""torchvision ResNet-18 state dict -> Flax: name mapping, fc handling, errors, and (where PyTorch is
installed) embeddings equal to the torch network's to 1e-4."""
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from f2m_jax.models import resnet18
from f2m_jax.models import torch_import
from f2m_jax.models.torch_import import WeightsError


def _variables(num_classes=10, width=8, size=32, seed=0, shapes_only=False):
  model = resnet18(num_classes, width=width)
  init = lambda k: model.init(k, jnp.zeros((1, size, size, 3)), train=False)
  v = jax.eval_shape(init, jax.random.key(seed)) if shapes_only else jax.jit(init)(jax.random.key(seed))
  return model, v['params'], v['batch_stats']


@pytest.fixture(scope='module')
def small():
  """Random numpy values in the shapes of a width-8 ResNet-18 (no XLA compile needed)."""
  model, params, stats = _variables(shapes_only=True)
  rng = np.random.default_rng(0)
  fill = lambda s: rng.normal(size=s.shape).astype(np.float32)
  return model, jax.tree_util.tree_map(fill, params), jax.tree_util.tree_map(fill, stats)


def _leaves_equal(a, b):
  chex.assert_trees_all_equal(a, b)


# ---------------------------------------------------------------- without torch

def test_torch_names():
  assert torch_import.torch_name('params', ('conv1', 'kernel')) == 'conv1.weight'
  assert torch_import.torch_name('params', ('bn1', 'scale')) == 'bn1.weight'
  assert torch_import.torch_name('batch_stats', ('layer3_1', 'bn2', 'var')) == 'layer3.1.bn2.running_var'
  assert torch_import.torch_name('params', ('layer2_0', 'downsample_conv', 'kernel')) == 'layer2.0.downsample.0.weight'
  assert torch_import.torch_name('params', ('layer2_0', 'downsample_bn', 'bias')) == 'layer2.0.downsample.1.bias'
  assert torch_import.torch_name('params', ('fc', 'kernel')) == 'fc.weight'


def test_round_trip_and_fc_kept_when_sizes_differ(small):
  _, p_tmpl, s_tmpl = small
  params = jax.tree_util.tree_map(lambda x: np.asarray(x) * 2 + 1, p_tmpl)  # differ from the template
  stats = jax.tree_util.tree_map(lambda x: np.asarray(x) + 0.5, s_tmpl)
  sd = torch_import.to_state_dict(params, stats)
  assert sd['conv1.weight'].shape == (8, 3, 7, 7) and sd['fc.weight'].shape == (10, 64)
  sd['layer1.0.bn1.num_batches_tracked'] = np.asarray(5)
  got_p, got_s = torch_import.convert_state_dict({'state_dict': {f'module.{k}': v for k, v in sd.items()}},
                                                 p_tmpl, s_tmpl)
  _leaves_equal(got_p, params)
  _leaves_equal(got_s, stats)
  # An ImageNet-sized classifier is skipped: the template's (ours) is kept, the rest converted.
  sd['fc.weight'], sd['fc.bias'] = np.zeros((1000, 64), np.float32), np.zeros((1000,), np.float32)
  got_p, _ = torch_import.convert_state_dict(sd, p_tmpl, s_tmpl)
  _leaves_equal(got_p['fc'], p_tmpl['fc'])
  _leaves_equal(got_p['layer4_1'], params['layer4_1'])


def test_mismatches_are_errors(small):
  _, params, stats = small
  sd = torch_import.to_state_dict(params, stats)
  missing = dict(sd)
  del missing['layer3.1.conv2.weight']
  with pytest.raises(WeightsError, match='missing: layer3.1.conv2.weight'):
    torch_import.convert_state_dict(missing, params, stats)
  with pytest.raises(WeightsError, match='unexpected: layer1.2.conv1.weight'):
    torch_import.convert_state_dict({**sd, 'layer1.2.conv1.weight': sd['layer1.1.conv1.weight']}, params, stats)
  _, wide_p, wide_s = _variables(width=16, shapes_only=True)
  with pytest.raises(WeightsError, match='of another shape'):
    torch_import.convert_state_dict(sd, wide_p, wide_s)


def test_missing_file_and_missing_torch(tmp_path, monkeypatch):
  model = resnet18(10, width=8)
  with pytest.raises(WeightsError, match='not found.*resnet18-f37072fd.pth'):
    torch_import.load_torchvision_resnet18(tmp_path / 'nope.pth', model, 32)
  f = tmp_path / 'w.pth'
  f.write_bytes(b'not a checkpoint')
  monkeypatch.setitem(sys.modules, 'torch', None)  # import torch -> ImportError
  with pytest.raises(WeightsError, match='pip install torch'):
    torch_import.load_torchvision_resnet18(f, model, 32)


# ---------------------------------------------------------------- against PyTorch

def _torch_resnet18(width: int, num_classes: int):
  """torchvision's resnet18 (same module names), written out so torchvision is not needed."""
  import torch  # pylint: disable=g-import-not-at-top (optional)
  nn = torch.nn

  class BasicBlock(nn.Module):
    def __init__(self, inp, out, stride):
      super().__init__()
      self.conv1 = nn.Conv2d(inp, out, 3, stride, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(out)
      self.relu = nn.ReLU(inplace=True)
      self.conv2 = nn.Conv2d(out, out, 3, 1, 1, bias=False)
      self.bn2 = nn.BatchNorm2d(out)
      self.downsample = None
      if stride != 1 or inp != out:
        self.downsample = nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
      identity = x if self.downsample is None else self.downsample(x)
      y = self.relu(self.bn1(self.conv1(x)))
      return self.relu(self.bn2(self.conv2(y)) + identity)

  class ResNet18(nn.Module):
    def __init__(self):
      super().__init__()
      w = [width, 2 * width, 4 * width, 8 * width]
      self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
      self.bn1 = nn.BatchNorm2d(width)
      self.relu = nn.ReLU(inplace=True)
      self.maxpool = nn.MaxPool2d(3, 2, 1)
      inp = width
      for i in range(4):
        stride = 1 if i == 0 else 2
        setattr(self, f'layer{i + 1}', nn.Sequential(BasicBlock(inp, w[i], stride), BasicBlock(w[i], w[i], 1)))
        inp = w[i]
      self.avgpool = nn.AdaptiveAvgPool2d(1)
      self.fc = nn.Linear(inp, num_classes)

    def embed(self, x):
      x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
      for i in range(4):
        x = getattr(self, f'layer{i + 1}')(x)
      return self.avgpool(x).flatten(1)

  return ResNet18()


def test_embeddings_match_torch(tmp_path):
  torch = pytest.importorskip('torch', reason='PyTorch not installed (optional extra: pip install torch)')
  torch.manual_seed(0)
  width, size = 64, 64
  net = _torch_resnet18(width, 1000)
  with torch.no_grad():  # random BN parameters and running statistics, so BN is really tested
    for m in net.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        m.weight.uniform_(0.5, 1.5)
        m.bias.normal_(0.0, 0.2)
        m.running_mean.normal_(0.0, 0.2)
        m.running_var.uniform_(0.5, 2.0)
        m.num_batches_tracked.fill_(7)
  net.eval()
  path = tmp_path / 'resnet18.pth'
  torch.save(net.state_dict(), path)

  x = np.random.default_rng(0).normal(size=(3, size, size, 3)).astype(np.float32)
  with torch.no_grad():
    want_emb = net.embed(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()
    want_logits = net.fc(torch.from_numpy(want_emb)).numpy()

  model = resnet18(1000, width=width)
  params, stats = torch_import.load_torchvision_resnet18(path, model, size)
  emb, logits = model.apply({'params': params, 'batch_stats': stats}, jnp.asarray(x), train=False)
  diff = float(np.max(np.abs(np.asarray(emb) - want_emb)))
  print(f'max |embedding difference| = {diff:.3g} (embedding max |value| {np.max(np.abs(want_emb)):.3g})')
  assert diff < 1e-4
  np.testing.assert_allclose(np.asarray(logits), want_logits, atol=1e-4)  # same classifier size: converted

  # 60 base classes: the 1000-way classifier is skipped, everything else is the same conversion.
  _, p60, s60 = _variables(num_classes=60, width=width, size=size, shapes_only=True)
  got_p, got_s = torch_import.convert_state_dict(torch.load(path, weights_only=True), p60, s60)
  assert got_p['fc']['kernel'] is p60['fc']['kernel'] and got_p['fc']['bias'] is p60['fc']['bias']
  _leaves_equal({k: v for k, v in got_p.items() if k != 'fc'}, {k: v for k, v in params.items() if k != 'fc'})
  _leaves_equal(got_s, stats)
