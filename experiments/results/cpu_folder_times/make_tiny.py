"""A folder of Tiny-ImageNet's shape, in small, for timing the folder source (issue 83): OUT/train/<wnid>/images/
<wnid>_<k>.JPEG (64x64 RGB, a few greyscale), OUT/val/images/val_<i>.JPEG named by OUT/val/val_annotations.txt,
OUT/wnids.txt; 100 classes, 100 training and 20 validation images each (the real set: 200 classes, 500 and 50).
Each class is a coloured grating of its own angle and frequency, plus noise.

  python experiments/results/cpu_folder_times/make_tiny.py OUT
"""
import pathlib
import sys

import numpy as np
from PIL import Image

out, rng = pathlib.Path(sys.argv[1]), np.random.default_rng(0)
wnids = [f'n{c:08d}' for c in range(100)]
yy, xx = np.mgrid[:64, :64] / 64


def image(c: int) -> Image.Image:
  angle, freq = 2 * np.pi * c / 100, 1 + c % 7
  wave = np.sin(2 * np.pi * freq * (np.cos(angle) * xx + np.sin(angle) * yy) + rng.uniform(0, 6.3))
  colour = 0.5 + 0.5 * np.sin(c + np.arange(3))
  pixels = 128 + 90 * wave[..., None] * colour + rng.normal(0, 20, (64, 64, 3))
  img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
  return img.convert('L') if rng.uniform() < 0.015 else img  # Tiny-ImageNet holds some greyscale files


lines = []
for c, w in enumerate(wnids):
  (out / 'train' / w / 'images').mkdir(parents=True, exist_ok=True)
  for k in range(100):
    image(c).save(out / 'train' / w / 'images' / f'{w}_{k}.JPEG')
(out / 'val' / 'images').mkdir(parents=True, exist_ok=True)
for i in range(20 * len(wnids)):
  image(i % 100).save(out / 'val' / 'images' / f'val_{i}.JPEG')
  lines.append(f'val_{i}.JPEG\t{wnids[i % 100]}\t0\t0\t63\t63\n')
(out / 'val' / 'val_annotations.txt').write_text(''.join(lines))
(out / 'wnids.txt').write_text(''.join(f'{w}\n' for w in wnids))
