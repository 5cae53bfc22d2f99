"""Size of the package as issue 84 counts it: NAME, OP, NUMBER and STRING tokens (Python's tokenize;
before Python 3.12 a whole f-string is one STRING token) of every f2m_jax/**/*.py, per file and per
top-level function or class (a class's methods listed apart), and the lines over 100 characters.

  python3 experiments/token_counts.py [--functions N] [FOLDER ...]   (default: f2m_jax f2m_jax/run)
"""
import argparse
import ast
import io
import pathlib
import tokenize

COUNTED = (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING)


def tokens(source):
  """The counted tokens of `source`, as (line, token) pairs."""
  return [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(source).readline)
          if t.type in COUNTED]


def definitions(tree):
  """The module's top-level functions and classes, and each class's methods, as (name, node)."""
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
      yield node.name, node
    if isinstance(node, ast.ClassDef):
      for method in node.body:
        if isinstance(method, ast.FunctionDef):
          yield f'{node.name}.{method.name}', method


def count(folder):
  """({file: tokens}, [(tokens, 'file:definition')], lines over 100 characters) of `folder`."""
  per_file, per_definition, long_lines = {}, [], 0
  for path in sorted(pathlib.Path(folder).rglob('*.py')):
    source = path.read_text(encoding='utf-8')
    counted = tokens(source)
    per_file[str(path)] = len(counted)
    long_lines += sum(len(line) > 100 for line in source.splitlines())
    for name, node in definitions(ast.parse(source)):
      n = sum(node.lineno <= line <= node.end_lineno for line, _ in counted)
      per_definition.append((n, f'{path}:{name}'))
  return per_file, per_definition, long_lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('folders', nargs='*', default=['f2m_jax', 'f2m_jax/run'])
  parser.add_argument('--functions', type=int, default=0, help='list the N largest definitions')
  args = parser.parse_args()
  for folder in args.folders:
    per_file, per_definition, long_lines = count(folder)
    print(f'{folder}: {sum(per_file.values()):,} tokens in {len(per_file)} files, '
          f'{long_lines} lines over 100 characters')
    for n, name in sorted(per_definition, reverse=True)[:args.functions]:
      print(f'  {n:6,} {name}')


if __name__ == '__main__':
  main()
