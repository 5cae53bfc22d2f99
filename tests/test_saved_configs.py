"""How a saved config.json is read (workdir.config_differences; docs/development.md, "Adding a config
field"): a field it lacks takes its default only where it records the current config format, a field
this code no longer has is refused unless it changes no result, and a refusal names the commit that
reads it. A method's own section is compared only when that method runs. Its 'auto' stays 'auto', for
the backend it is run on."""
import json

import pytest
from flax import traverse_util

from f2m_jax import files
from f2m_jax import registry
from f2m_jax.run import workdir

F = {'config_format': workdir.CONFIG_FORMAT}  # written under the rule
DEFAULTS = {'method': 'f2m', 'noise.bound': 0.005, 'noise.pf_gradient': False, 'base.milestones': []}
NOW = {'method': 'f2m', 'noise': {'bound': 0.005, 'pf_gradient': False}, 'base': {'milestones': ()}}
BEFORE_PF_GRADIENT = {'method': 'f2m', 'noise': {'bound': 0.005}, 'base': {'milestones': []}}

CASES = [
    # (what, saved config.json, current config, differences)
    ('identical', {**F, **NOW}, NOW, []),
    ('records beside the config are not fields',
     {**F, **NOW, 'base_source': {'path': '/w'}, 'git': {'commit': 'abc', 'dirty': False}}, NOW, []),
    ('a value changed', {**F, **NOW, 'noise': {'bound': 0.01, 'pf_gradient': False}}, NOW, ['noise.bound']),
    ('a field added since: its default', {**F, **BEFORE_PF_GRADIENT}, NOW, []),
    ('a field added since, now set otherwise than its default', {**F, **BEFORE_PF_GRADIENT},
     {**NOW, 'noise': {'bound': 0.005, 'pf_gradient': True}}, ['noise.pf_gradient']),
    # noise.pf_gradient was True before the field existed; its default is False: a config.json older than
    # the format must never read as False.
    ('a field added since, written before configs recorded their format', BEFORE_PF_GRADIENT, NOW,
     ['noise.pf_gradient']),
    ('the same under the old behaviour', BEFORE_PF_GRADIENT, {**NOW, 'noise': {'bound': 0.005, 'pf_gradient': True}},
     ['noise.pf_gradient']),
    ('written before configs recorded their format, holding every field', NOW, NOW, []),
    ('written by a newer format', {'config_format': workdir.CONFIG_FORMAT + 1, **BEFORE_PF_GRADIENT}, NOW,
     ['noise.pf_gradient']),
    ('a field with no default, added since', {**F, **NOW}, {**NOW, 'data': {'image_size': 84}}, ['data.image_size']),
    ('a field removed since', {**F, **NOW, 'noise': {'bound': 0.005, 'pf_gradient': False, 'pf_classes': 'batch'}},
     NOW, ['noise.pf_classes']),
    ('a field removed since that changed no result', {**F, **NOW, 'model': {'conv_backward': 'cpu'}}, NOW, []),
    ('fields that change no result', {**F, **NOW, 'eval': {'batch_size': 100}, 'bench': {'iters': 3}},
     {**NOW, 'eval': {'batch_size': 500}}, []),
]


@pytest.mark.parametrize('what,saved,current,differences', CASES, ids=[c[0] for c in CASES])
def test_how_a_saved_config_compares(what, saved, current, differences):
  assert workdir.config_differences(saved, current, DEFAULTS) == differences, what


def test_a_methods_own_section_is_compared_only_for_that_method():
  assert registry.method_sections()['crt'] == 'crt'  # the sections config_differences reads
  differences = workdir.config_differences
  current = {'method': 'f2m', 'crt': {'lr': 0.1, 'epochs': 17}}
  assert differences({'method': 'f2m'}, current) == []  # written before cRT existed
  assert differences({'method': 'f2m', 'crt': {'lr': 0.5, 'epochs': 17}}, current) == []
  crt = {'method': 'crt', 'crt': {'lr': 0.1, 'epochs': 17}}
  assert differences({'method': 'crt', 'crt': {'lr': 0.5, 'epochs': 17}}, crt) == ['crt.lr']
  assert differences({'method': 'f2m'}, crt) == ['crt.epochs', 'crt.lr', 'method']


def write(folder, name, doc):
  folder.mkdir(exist_ok=True)
  (folder / name).write_text(json.dumps(doc))
  return str(folder / name)


def test_a_recorded_config_reads_as_a_resume_reads_it(tmp_path):
  """A config.json of the current format read as a config: the fields it lacks take configs/common.py's
  defaults, lists are tuples again, the fields of a dataset config of its own (data.image_size) and the
  records beside the config are kept and dropped as they are; a removed field that changes no result is
  dropped."""
  defaults = workdir.default_items({})
  saved = {k: v for k, v in defaults.items() if k != 'noise.pf_gradient'}
  saved.update({'noise.bound': 0.01, 'base.milestones': [50], 'data.image_size': 84, 'bench.gone': 1})
  doc = {**traverse_util.unflatten_dict(saved, sep='.'), **F, 'base_source': None, 'git': {'commit': 'c'}}
  config = workdir.recorded_config(write(tmp_path, 'config.json', doc))
  assert config['noise']['pf_gradient'] is defaults['noise.pf_gradient']
  assert config['noise']['bound'] == 0.01 and config['base']['milestones'] == (50,)
  assert config['data']['image_size'] == 84 and 'gone' not in config['bench']
  assert not set(config) & set(workdir.RECORD_KEYS)
  assert set(workdir.flat_items(config)) == set(defaults) | {'data.image_size'}


def test_a_folder_record_written_before_class_depth_reads_its_top_folders_as_classes(tmp_path):
  """data.folder.class_depth's default (0: an image's own folder) reads nested folders otherwise than the
  code that wrote a record lacking it (their top folder, 1): such a record keeps what it computed."""
  defaults = workdir.default_items({'data.folder.root': ''})
  saved = {k: v for k, v in defaults.items() if k != 'data.folder.class_depth'}
  doc = {**traverse_util.unflatten_dict(saved, sep='.'), **F}
  assert defaults['data.folder.class_depth'] == 0
  assert workdir.recorded_config(write(tmp_path, 'config.json', doc))['data']['folder']['class_depth'] == 1
  assert workdir.config_differences(doc, {**traverse_util.unflatten_dict(defaults, sep='.')}) == \
      ['data.folder.class_depth']


@pytest.mark.parametrize('fmt', [None, workdir.CONFIG_FORMAT])
def test_a_recorded_config_this_code_cannot_read_is_refused_with_the_commit_to_go_back_to(tmp_path, fmt):
  """Lacking a field before configs recorded their format, or holding a result-relevant field this code
  no longer has: refused by name, with the commit that wrote it (recorded, else its results.json's)."""
  defaults = traverse_util.unflatten_dict(workdir.default_items({}), sep='.')
  if fmt is None:
    del defaults['noise']['pf_gradient']
    doc, field = defaults, "noise.pf_gradient: saved '<absent>', now False"
    write(tmp_path, 'results.json', {'provenance': {'git': {'commit': 'abc123'}}})
  else:
    defaults['noise']['pf_classes'] = 'all_base'
    doc, field = {**defaults, **F, 'git': {'commit': 'abc123'}}, "noise.pf_classes: saved 'all_base', now '<absent>'"
  path = write(tmp_path, 'config.json', doc)
  with pytest.raises(files.WorkdirError) as error:
    workdir.recorded_config(path)
  assert field in str(error.value) and 'commit that wrote' in str(error.value) and 'abc123' in str(error.value)


def test_a_new_record_holds_the_config_format_and_the_commit(tmp_path):
  config = {'method': 'f2m', 'noise': {'bound': 0.005}}
  workdir.prepare(str(tmp_path / 'w'), config).close()
  saved = json.loads((tmp_path / 'w' / 'config.json').read_text())
  assert saved['config_format'] == workdir.CONFIG_FORMAT and saved['base_source'] is None
  assert saved['git'] == workdir.git_state() and saved['noise'] == config['noise']
  workdir.prepare(str(tmp_path / 'w'), config).close()  # and resumes under the same config
  other = {'method': 'f2m', 'noise': {'bound': 0.01}}
  workdir.prepare(str(tmp_path / 'w' / 'member_0'), config).close()  # issue 82: a run (a sweep's
  workdir.prepare(str(tmp_path / 'w'), other).close()  # member too) that recorded nothing gives way
  (tmp_path / 'w' / 'member_0' / 'metrics.jsonl').write_text('{}\n')  # a record: its config is kept
  with pytest.raises(files.WorkdirError, match=r"noise.bound: saved 0.01, now 0.005.*Drop --config"):
    workdir.prepare(str(tmp_path / 'w'), config)


def test_auto_stays_auto_and_the_backend_a_workdir_is_run_on_resolves_it(tmp_path, monkeypatch):
  """config.json keeps each 'auto'; the metrics log's start line records what it became and on which
  backend; on another (a GPU, mocked) it resolves to that backend's choices, and `backend.moved` is the
  one line naming each that changed (tests/test_records.py: printed by an evaluation)."""
  import jax  # pylint: disable=g-import-not-at-top
  from configs import cifar100  # pylint: disable=g-import-not-at-top
  from f2m_jax.run import pipeline  # pylint: disable=g-import-not-at-top
  from f2m_jax.run import backend
  config = cifar100.get_config('smoke')
  workdir.prepare(str(tmp_path), pipeline.effective(config).to_dict()).close()
  saved = json.loads((tmp_path / 'config.json').read_text())
  assert (saved['noise']['draw_map'], saved['model']['conv_backward']) == ('auto', 'auto')
  cpu = pipeline.resolve(config, reads_data=False)
  log = workdir.MetricsLog(str(tmp_path))
  log.start('train', **backend.record(cpu))
  log.write(phase='done')
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  gpu = pipeline.resolve(config, reads_data=False)
  assert backend.used(gpu) == {'noise.draw_map': 'vmap', 'model.conv_backward': 'xla'} == backend.choices('gpu')
  assert backend.used(backend.resolve(config, 'cpu')) == backend.used(cpu) == backend.choices('cpu')
  [last] = workdir.MetricsLog(str(tmp_path)).invocations
  assert last['backend'] == 'cpu' and last['choices'] == backend.used(cpu)
  assert backend.moved(last, gpu) == ("noise.draw_map: 'unroll' when this workdir was last run (cpu), 'vmap' now "
                                      "(gpu); model.conv_backward: 'cpu' when this workdir was last run (cpu), 'xla' "
                                      "now (gpu)")
  assert backend.moved(last, cpu) is None and backend.moved({}, gpu) is None  # the same choices; no record of any
