"""The before/after table of frictions.sh's two runs: python table.py OLD_OUT NEW_OUT > table.md"""
import re, sys, os
def rows(d):
  out = {}
  for line in open(os.path.join(d, 'cases.tsv')):
    parts = line.rstrip('\n').split('\t')
    if len(parts) >= 4 and re.match(r'^(reference|4[468]\.)', parts[0]):
      out[parts[0]] = parts
  return out
def key_line(d, case):
  path = os.path.join(d, case + '.log')
  if not os.path.exists(path): return ''
  text = open(path, errors='replace').read().replace('\r', '\n')
  lines = [l.strip() for l in text.split('\n') if l.strip() and not l.startswith('$ ')]
  for pat in (r'(^|\])(error|interrupted|report: warning|training stopped)', r'(Error|Traceback|hang)'):
    hits = [l for l in lines if re.search(pat, l)]
    if hits:
      m = re.search(r'(error|interrupted|training stopped|report: warning)', hits[-1])
      return hits[-1][m.start():] if m else hits[-1]
  lines = [l for l in lines if not re.search(r'it/s|session/s|s/session|^PD:|^\|', l)]
  return lines[-1] if lines else ''
old, new = rows(sys.argv[1]), rows(sys.argv[2])
def cell(d, r, case):
  if r is None: return 'not run'
  rc = r[1].replace('rc=', '')
  wrote = r[3].strip()
  return f"exit {rc}; left: {wrote or '(empty)'}; `{key_line(d, case)[:200].replace('|', '/')}`"
print('| case | 4928fab | now |'); print('| --- | --- | --- |')
for case in new:
  print(f'| {case} | {cell(sys.argv[1], old.get(case), case)} | {cell(sys.argv[2], new[case], case)} |')
