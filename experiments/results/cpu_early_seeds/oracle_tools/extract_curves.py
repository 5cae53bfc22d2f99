# Parses the authors' train logs: the k-th 'Val_acc' line in a run is the validation at iteration
# k*val_freq (train.py validates when current_iter % val_freq == 0); the one after 'Best acc is' is
# the final validation at the last iteration (3*(epoch+1) = 1002).
import glob, json, re
VAL_FREQ, FINAL = 250, 1002
rows = []
for seed in (0, 1, 2):
    logs = sorted(glob.glob(f'/work/oracle/authors/F2M/exp/cifar-100_bases60/oracle_F2M_trainsplit_it1002_seed{seed}/train_*.log'))
    if not logs: continue
    txt = open(logs[-1]).read().splitlines()
    k, after_best = 0, False
    for line in txt:
        if 'Best acc is' in line: after_best = True
        m = re.search(r'Val_acc \t ([0-9.]+)', line)
        if m:
            acc = float(m.group(1)) * 100
            if after_best:
                rows.append({'seed': seed, 'iteration': FINAL, 'base_test_acc': round(acc, 3), 'final': True})
            else:
                k += 1
                rows.append({'seed': seed, 'iteration': k * VAL_FREQ, 'base_test_acc': round(acc, 3)})
with open('/work/oracle/authors/curves.jsonl', 'w') as f:
    for r in rows: f.write(json.dumps(r) + '\n')
for r in rows: print(r)
