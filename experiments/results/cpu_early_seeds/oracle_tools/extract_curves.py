# Parses the authors' train logs: the k-th 'Val_acc' line in a run is the validation at iteration
# k*val_freq (train.py validates when current_iter % val_freq == 0); the one after 'Best acc is' is
# the final validation at the last iteration (3*(epoch+1) = 1002). A run folder their code renamed
# '..._archived_<time>' (a rerun of the same YAML) is kept, with its folder name in 'run'.
#   python extract_curves.py [OUT.jsonl]
import glob, json, os, re, sys
VAL_FREQ, FINAL = 250, 1002
EXP = '/work/oracle/authors/F2M/exp/cifar-100_bases60'
rows = []
for seed in (0, 1, 2):
    for run in sorted(glob.glob(f'{EXP}/oracle_F2M_trainsplit_it1002_seed{seed}') +
                      glob.glob(f'{EXP}/oracle_F2M_trainsplit_it1002_seed{seed}_archived_*')):
        logs = sorted(glob.glob(f'{run}/train_*.log'))
        if not logs: continue
        txt = open(logs[-1]).read().splitlines()
        k, after_best = 0, False
        for line in txt:
            if 'Best acc is' in line: after_best = True
            m = re.search(r'Val_acc \t ([0-9.]+)', line)
            if m:
                acc = float(m.group(1)) * 100
                row = {'seed': seed, 'run': os.path.basename(run), 'base_test_acc': round(acc, 3)}
                if after_best:
                    row.update(iteration=FINAL, final=True)
                else:
                    k += 1
                    row.update(iteration=k * VAL_FREQ)
                rows.append(row)
out = sys.argv[1] if len(sys.argv) > 1 else '/work/oracle/authors/curves.jsonl'
with open(out, 'w') as f:
    for r in rows: f.write(json.dumps(r) + '\n')
for r in rows: print(r)
