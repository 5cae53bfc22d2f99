# Builds the CIFAR-100 `trainsplit` protocol as PNG image folders for the authors' NormalDataset.
import os, numpy as np
from PIL import Image
D = '/work/shared/data'
OUT = '/work/oracle/authors/data/cifar100_trainsplit'
z = np.load(f'{D}/cifar100_train.npz', allow_pickle=False)
x, y, names = z['x_train'], z['y_train'].astype(np.int64), z['label_names']
rd = lambda t: [int(l) for l in open(f'{D}/index_list/cifar100/session_{t}.txt').read().split()]
s1 = rd(1)
shots = set(i for t in range(2, 10) for i in rd(t))
test = {}
for c in range(100):
    Ic = np.sort(np.where(y == c)[0]); assert len(Ic) == 500
    test[c] = [int(i) for i in Ic if int(i) not in shots][-100:]
    assert len(test[c]) == 100
testset = set(i for c in test for i in test[c])
train = [i for i in s1 if i not in testset]
assert set(y[s1]) == set(range(60))
def folder(c): return f'{c:03d}_{names[c]}'
ntr = nte = 0
for i in train:
    d = f'{OUT}/train/{folder(y[i])}'; os.makedirs(d, exist_ok=True)
    Image.fromarray(x[i]).save(f'{d}/{i:05d}.png'); ntr += 1
for c in range(60):
    d = f'{OUT}/test/{folder(c)}'; os.makedirs(d, exist_ok=True)
    for i in test[c]:
        Image.fromarray(x[i]).save(f'{d}/{i:05d}.png'); nte += 1
print('train', ntr, 'test', nte, 'unique train', len(set(train)))
from collections import Counter
cnt = Counter(int(y[i]) for i in train); print('per-class train min/max', min(cnt.values()), max(cnt.values()), len(cnt))
