"""The package's layers, read from its source without importing it (no JAX needed).

f2m_jax is layered: a module imports modules of its own layer or below, never above; no import
cycle; every import of the package at module level (a function-level import hides a cycle or a layer
breach); no module reads another module's private (`_name`) names. LAYERS is the map, in two groups:
CORE, the method and its data (every module outside f2m_jax/run/), which a researcher changes; then
RUN, f2m_jax/run/, the records and the command line, above every core layer, so that nothing in the
core imports run/. A new module must be placed in it (docs/development.md).
"""
from __future__ import annotations

import ast
import fnmatch
import graphlib
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / 'f2m_jax'

# Bottom to top, CORE then RUN (the module docstring). Patterns are module names relative to f2m_jax
# ('data.*': every module of data/).
CORE = (
    ('foundations', ('files', 'stats', 'data', 'data.*', 'models', 'models.*', 'trees', 'padding', 'optim', 'noise',
                     'objectives', 'sharding', 'progress')),
    ('algorithms', ('base', 'incremental', 'evaluation', 'flatness')),
    ('run description', ('experiment', 'validation')),
    ('run stages', ('train_loop', 'evaluator', 'sessions')),
    ('method interface', ('methods', 'methods.common')),
    ('methods', ('methods.*',)),
    ('registry', ('registry', '__init__')),
)
RUN = (
    ('records', ('run', 'run.backend', 'run.workdir', 'run.checkpoint', 'run.stopping', 'run.report', 'run.memory')),
    ('pipeline', ('run.pipeline',)),
    ('sweeps', ('run.members',)),
    ('entry points', ('run.bench', 'run.cli', 'run.dry_run')),
)
LAYERS = CORE + RUN


def module_name(path: pathlib.Path, root: pathlib.Path = PACKAGE) -> str:
  parts = path.relative_to(root).with_suffix('').parts
  if parts[-1] == '__init__' and len(parts) > 1:
    parts = parts[:-1]
  return '.'.join(parts)


def layer_of(module: str) -> int:
  """Index in LAYERS of the first layer whose patterns name `module` (exact names win over '*')."""
  for exact in (True, False):
    for i, (_, patterns) in enumerate(LAYERS):
      for pattern in patterns:
        if (pattern == module) if exact else ('*' in pattern and fnmatch.fnmatchcase(module, pattern)):
          return i
  raise AssertionError(f'f2m_jax.{module} is in no layer: add it to LAYERS in tests/test_layers.py')


def resolve(target: str, modules: set) -> str:
  """'f2m_jax.a.b' (a module, or a name in module a) -> the module's name relative to f2m_jax."""
  rel = target[len('f2m_jax.'):] if target.startswith('f2m_jax.') else ''
  while rel and rel not in modules:
    rel = rel.rpartition('.')[0]
  return rel or '__init__'


class Imports(ast.NodeVisitor):
  """The package imports of one module: (line, target module, names, at module level?), and every
  use of a private name of another package module (`alias._x`, `from f2m_jax.x import _y`)."""

  def __init__(self, modules: set):
    self.modules, self.depth = modules, 0
    self.found, self.private, self.aliases = [], [], {}

  def _scoped(self, node):
    self.depth += 1
    self.generic_visit(node)
    self.depth -= 1

  visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = visit_ClassDef = _scoped

  def visit_Import(self, node):
    for alias in node.names:
      if alias.name == 'f2m_jax' or alias.name.startswith('f2m_jax.'):
        target = resolve(alias.name, self.modules)
        self.found.append((node.lineno, target, self.depth == 0))
        self.aliases[alias.asname or alias.name] = target

  def visit_ImportFrom(self, node):
    if node.level or not node.module or not (node.module == 'f2m_jax' or node.module.startswith('f2m_jax.')):
      return
    for alias in node.names:
      target = resolve(f'{node.module}.{alias.name}', self.modules)
      self.found.append((node.lineno, target, self.depth == 0))
      if target == resolve(node.module, self.modules) and alias.name.startswith('_'):
        self.private.append((node.lineno, f'{node.module}.{alias.name}'))
      if target != resolve(node.module, self.modules):  # the name is a module
        self.aliases[alias.asname or alias.name] = target

  def visit_Attribute(self, node):
    if (isinstance(node.value, ast.Name) and node.value.id in self.aliases and node.attr.startswith('_')
        and not node.attr.startswith('__')):
      self.private.append((node.lineno, f'{self.aliases[node.value.id]}.{node.attr}'))
    self.generic_visit(node)


def package_imports(root: pathlib.Path = PACKAGE) -> dict:
  """{module: Imports} for every module of the package under `root`."""
  files = {module_name(p, root): p for p in sorted(root.rglob('*.py'))}
  out = {name: Imports(set(files)) for name in files}
  for name, path in files.items():
    out[name].visit(ast.parse(path.read_text(), str(path)))
  return out


def find_cycle(edges: dict):
  """A list of modules forming an import cycle (first == last, each importing the next), or None."""
  try:
    graphlib.TopologicalSorter(edges).prepare()
  except graphlib.CycleError as e:
    return e.args[1][::-1]  # graphlib lists each module's importer next
  return None


def problems(root: pathlib.Path = PACKAGE) -> list:
  """Every breach of the rules above, one line each (empty: the package is layered)."""
  imports = package_imports(root)
  out = []
  edges = {}
  for module, found in imports.items():
    layer = layer_of(module)
    for line, target, top_level in found.found:
      if target == module:
        continue
      edges.setdefault(module, set()).add(target)
      if not top_level:
        out.append(f'f2m_jax.{module}:{line} imports f2m_jax.{target} inside a function or class '
                   '(import it at module level; a lazy import hides a cycle or a layer breach)')
      if layer_of(target) > layer:
        out.append(f'f2m_jax.{module}:{line} ({LAYERS[layer][0]}) imports f2m_jax.{target}, a layer above '
                   f'({LAYERS[layer_of(target)][0]})')
    for line, name in found.private:
      out.append(f'f2m_jax.{module}:{line} uses the private name f2m_jax.{name} of another module')
  cycle = find_cycle(edges)
  if cycle:
    out.append('import cycle: ' + ' -> '.join(f'f2m_jax.{m}' for m in cycle))
  return out


def test_the_package_is_layered():
  """Every module has a layer (layer_of raises naming one that has none) and breaks no rule."""
  modules = package_imports()
  in_run = {m for m in modules if layer_of(m) >= len(CORE)}  # layer_of raises naming a module in no layer
  assert in_run == {m for m in modules if m == 'run' or m.startswith('run.')}  # run/ above every core layer
  assert problems() == []


@pytest.mark.parametrize('breach, expected', [
    ({'noise.py': 'from f2m_jax import objectives\n', 'objectives.py': 'from f2m_jax import noise\n'},
     'import cycle: f2m_jax.noise -> f2m_jax.objectives -> f2m_jax.noise'),
    ({'noise.py': 'from f2m_jax.run import pipeline\n', 'run/__init__.py': '', 'run/pipeline.py': ''},
     'f2m_jax.noise:1 (foundations) imports f2m_jax.run.pipeline, a layer above (pipeline)'),
    ({'noise.py': 'def f():\n  from f2m_jax import objectives\n', 'objectives.py': ''},
     'f2m_jax.noise:2 imports f2m_jax.objectives inside a function'),
    ({'methods/__init__.py': '', 'methods/a.py': 'from f2m_jax.methods import b\nb._x\n', 'methods/b.py': ''},
     'f2m_jax.methods.a:2 uses the private name f2m_jax.methods.b._x of another module'),
])
def test_each_rule_fails_when_broken(tmp_path, breach, expected):
  """The check on a package made of `breach`'s files finds what it should: a cycle, a layer breach,
  a function-level import, a private name."""
  root = tmp_path / 'f2m_jax'
  for name, text in {'__init__.py': '', **breach}.items():
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
  assert any(p.startswith(expected) for p in problems(root)), problems(root)


def test_only_the_backend_module_reads_the_backend():
  """Every choice made by backend is f2m_jax/run/backend.py's (resolved once, recorded in config.json); the
  records of where a run ran (workdir.provenance) read the device but choose nothing."""
  readers = {module_name(p) for p in PACKAGE.rglob('*.py')
             if any(word in p.read_text() for word in ('default_backend', 'platform_dependent', 'memory_stats'))}
  assert readers <= {'run.backend', 'run.workdir', 'run.bench'}, readers


def branch_points(fn: ast.AST) -> int:
  """if, for, while, except, conditional expressions, boolean operators and comprehensions (with
  their conditions) in `fn`, nested functions included."""
  count = 0
  for node in ast.walk(fn):
    if isinstance(node, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler)):
      count += 1
    elif isinstance(node, ast.BoolOp):
      count += len(node.values) - 1
    elif isinstance(node, ast.comprehension):
      count += 1 + len(node.ifs)
  return count


def test_no_function_is_long_or_branchy():
  """A function a person can read in one go: at most 50 lines and 15 branch points."""
  long = []
  for path in PACKAGE.rglob('*.py'):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines, branches = node.end_lineno - node.lineno + 1, branch_points(node)
        if lines > 50 or branches > 15:
          long.append(f'{module_name(path)}.{node.name}: {lines} lines, {branches} branch points')
  assert not long, long

