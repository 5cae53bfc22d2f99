"""The TOPIC session lists (`index_list/<dataset>/session_*.txt`): found in the data folder or the cache,
else downloaded into the cache from the CEC repository at a pinned commit, each file's sha256 pinned."""
import hashlib
import http.client
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

# sha256 of every file, computed from the reference copy of the lists (TOPIC lists as copied in CEC).
SHA256 = {
    'cifar100': {
        'session_1.txt': '5f402fb2c5260a05bb02ea000f9b9e32f23e305281969afa6ea47a9a22b69cf7',
        'session_2.txt': '654db7b72e383a1aac94a4e570ea26c9f3cb8b7bf95a7aff2a9e1626f4e0b330',
        'session_3.txt': 'a466c0f920549096435c9b298e9f52f2b4a676db34f2c54de04f4147759a2eea',
        'session_4.txt': 'c2d0f0a6db516358055d448b1dd8033a778ae7ba30de78adbd8ea2e1b94282b0',
        'session_5.txt': '2907fe7d341f9f4da0c2cdf59bcf33a50619f41e9ebd3232fe2c6c11bc30bfa4',
        'session_6.txt': '87f70d04e01acb3ba0bbce24f84bf78ee905721d3609e53c5f11bf92d3237197',
        'session_7.txt': '70131153942c3a30418843097a482d0e24dedbaa394876b101db205a5099a595',
        'session_8.txt': '8bcefabac5ff2d3086e3cc097b306713661f07aa670ef3935570226293e1c2f1',
        'session_9.txt': '242fd41330db6081d11216a8324f92aebd64545b2171bd567a162a7521a62ed7',
    },
    'mini_imagenet': {
        'session_1.txt': 'af28c169b628923284b9905238a90a97b4a95949f66dd04f2853467a16e090a3',
        'session_2.txt': '0ca2664ee5be9852f7688e9f691397ba9ac23333b64afcbbb20012a22adee16a',
        'session_3.txt': '7a2b2d26f529247dc725d406125eab2a698523d8c669cd1e399c26d068e6d6fa',
        'session_4.txt': 'e70403ced5ac32b811962cdb498b0e01bb4444da0d20539f6f183db17fe158c2',
        'session_5.txt': '4b8aa1d08d1a0aa2a2ed6baefc3aa2e801ea0a6924a8056ca4c4737d60ac0460',
        'session_6.txt': 'c78365d507400f170186bc321bfa233dde1160c6df6405fba242dedda59d3070',
        'session_7.txt': 'ad01e6e88f92b8dbcfa38831051f41a2639b2f455695bd2bb5db5cd1129ef88a',
        'session_8.txt': 'ab39d572974acdd3e542040f3cd18b72a0fc97980f754b9335f99ca3df7f1847',
        'session_9.txt': 'e808c65f6e081f5b0061cc4a8bdec51dff4ae99cb37193d239a319e388ec1226',
        'test.csv': '02516c97275c6f28a9f088cf1e67bfda0081c9ebbf28d6de5216a09f8f656b0c',
        'test.txt': 'c714516c610cdb0fc558785259e06768bcddea6c2a57b1b5464be0e04fae0a77',
        'train.csv': '6e1b0901693e2e872d8b72c311dda2afd05da93e6ca2cc16b5f742be4b18c2fc',
        'train.txt': '5197fcc34877621033f9cf0a415b0484335e4c5a9a97df8904a6a061922abe57',
    },
    'cub200': {
        'session_1.txt': '51ac011fc2cf87c374350a70ca9fbe210eb10f406b24b6675e2e143586ca24fc',
        'session_2.txt': '24d1ebea2ff962c13475ad7aa660c1e6cbeb8ecca053d82d22fabc7e7a323400',
        'session_3.txt': '531b4cdc44b54d18059ed7f2a758fc22a55ea2f3eb0b814b38a508e6ea3fb371',
        'session_4.txt': 'b0415d1fe51d8b9216f0097fdc73817b7813b5b5c8a3e2fbaf43131abff4becf',
        'session_5.txt': '44e4ae53379abbf93767bc4937c36eb2e72d1741875805128f1bfee1fa6093a8',
        'session_6.txt': 'dd2ac89166e698b316e24b4cbff025c5aaaf517712b94f63930127785010af3c',
        'session_7.txt': 'ee5985b9b76466d368116cf25bce2ba994d9b0d4a79ac4e9055cffaff1771aa3',
        'session_8.txt': 'aebaffe49fa56c8a4e4bdaa1ad2d7bb9f54647369a2985f57779c5ce18b4230d',
        'session_9.txt': '69e3c194ea2d48cf2a99a7223ca094d14a3d34f308985def22587f324f3b24dc',
        'session_10.txt': '6f669352b66fecfb9b001263e9c7a47487a65f244ad5676d0790b06b55de6db4',
        'session_11.txt': 'fd3ceecd3e52d9c8f646bab41e3562d0f545c8746618fc5693ff85681a0506c1',
    },
}


def cache_folder(given=None):
  """Where downloads and converted files go (never into the data folder): `given`, else $F2M_CACHE_DIR,
  else ~/.cache/f2m_jax."""
  return given or os.environ.get('F2M_CACHE_DIR', '') or os.path.join(os.path.expanduser('~'), '.cache', 'f2m_jax')


def index_list_dir(dataset, data_dir=None, cache_dir=None, download=True):
  """The folder holding `session_*.txt` for `dataset`: `<data_dir or $F2M_DATA_DIR>/index_list/<dataset>`,
  else `<cache folder>/index_list/<dataset>`, its missing files downloaded (`download`; else None)."""
  data_dir = data_dir or os.environ.get(DATA_DIR_ENV)
  if data_dir and (pathlib.Path(data_dir) / 'index_list' / dataset / 'session_1.txt').is_file():
    return pathlib.Path(data_dir) / 'index_list' / dataset
  cached = pathlib.Path(cache_folder(cache_dir)) / 'index_list' / dataset
  if download:
    return download_index_lists(dataset, cached)
  return cached if all((cached / name).is_file() for name in SHA256[dataset]) else None


def download_index_lists(dataset, folder):
  """Downloads the missing list files of `dataset` into `folder` (returned), each checked against its
  sha256 and written atomically (temp file + rename), so the folder never holds a partial or wrong file."""
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
      raise DataError(f'The TOPIC index lists for {dataset} were not found and {problem}.\n'
                      f'Files needed: {", ".join(SHA256[dataset])}\nfrom {BASE_URL}/{dataset}/ (repository '
                      f'{CEC_REPO}, commit {CEC_COMMIT}).\nPut them in ${DATA_DIR_ENV}/index_list/{dataset}/ (set '
                      f'{DATA_DIR_ENV} to your data folder) or in the cache folder {folder}/.')
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
