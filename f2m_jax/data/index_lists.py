"""The TOPIC session lists (`index_list/<dataset>/session_*.txt`): found in the data folder or
the cache, else downloaded into the cache from the CEC repository at a pinned commit, each
file's sha256 pinned."""
import hashlib
import http.client
import json
import os
import pathlib
import urllib.request

from f2m_jax.data.download import TIMEOUT_S
from f2m_jax.data.types import DataError
from f2m_jax.files import written_atomically

DATA_DIR_ENV = 'F2M_DATA_DIR'
CEC_REPO = 'icoz69/CEC-CVPR2021'
CEC_COMMIT = 'dc262374125418c7aadf00cac30bbb686a5859b6'
BASE_URL = f'https://raw.githubusercontent.com/{CEC_REPO}/{CEC_COMMIT}/data/index_list'

# {dataset: {file: sha256}} of every list file, computed from the reference copy of the lists (TOPIC
# lists as copied in CEC).
SHA256 = json.loads(pathlib.Path(__file__).with_name('index_lists_sha256.json').read_text())


def cache_folder(given):
  """Where downloads and converted files go (never into the data folder): `given`, else
  $F2M_CACHE_DIR, else ~/.cache/f2m_jax."""
  return given or os.environ.get('F2M_CACHE_DIR') or os.path.expanduser('~/.cache/f2m_jax')


def index_list_dir(dataset, data_dir, cache_dir=None, download=True):
  """The folder holding `session_*.txt` for `dataset`: `<data_dir>/index_list/<dataset>` (data_dir
  '' or None: none), else `<cache folder>/index_list/<dataset>`, its missing files downloaded
  (`download`; else None)."""
  if data_dir and (pathlib.Path(data_dir) / 'index_list' / dataset / 'session_1.txt').is_file():
    return pathlib.Path(data_dir) / 'index_list' / dataset
  cached = pathlib.Path(cache_folder(cache_dir)) / 'index_list' / dataset
  if download:
    return download_index_lists(dataset, cached)
  return cached if all((cached / name).is_file() for name in SHA256[dataset]) else None


def download_index_lists(dataset, folder):
  """Downloads the missing list files of `dataset` into `folder` (returned), each checked against
  its sha256 and written atomically (temp file + rename), so the folder never holds a partial
  or wrong file."""
  for name, want in SHA256[dataset].items():
    if (folder / name).is_file():
      continue
    folder.mkdir(parents=True, exist_ok=True)
    url = f'{BASE_URL}/{dataset}/{name}'
    try:
      with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        data = response.read()
    except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts: OSError
      problem = f'could not download {url}: {e}'
    else:
      got = hashlib.sha256(data).hexdigest()
      problem = got != want and f'checksum mismatch for {url}: sha256 {got}, expected {want}'
    if problem:
      raise DataError(f'The TOPIC index lists for {dataset} were not found and {problem}.\nFiles '
                      f'needed: {", ".join(SHA256[dataset])}\nfrom {BASE_URL}/{dataset}/ '
                      f'(repository {CEC_REPO}, commit {CEC_COMMIT}).\nPut them in '
                      f'${DATA_DIR_ENV}/index_list/{dataset}/ (set {DATA_DIR_ENV} to your data '
                      f'folder) or in the cache folder {folder}/.')
    with written_atomically(folder / name) as tmp:
      tmp.write_bytes(data)
  return folder


def read_index_file(path):
  """The non-empty lines of one list file, stripped."""
  lines = pathlib.Path(path).read_text().splitlines()
  return [line.strip() for line in lines if line.strip()]


def session_lists(folder, num_sessions):
  """[lines of session_1.txt, ..., lines of session_<num_sessions>.txt]."""
  paths = [pathlib.Path(folder, f'session_{t}.txt') for t in range(1, num_sessions + 1)]
  missing = [p.name for p in paths if not p.is_file()]
  if missing:
    raise DataError(f'{folder} lacks {", ".join(missing)}')
  return [read_index_file(p) for p in paths]
