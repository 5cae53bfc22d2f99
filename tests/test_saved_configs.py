"""Saved workdir configs stay readable: fields added since read as the behaviour of their time, a
renamed field as its new name, a method's own section compared only when that method runs, and the
fields of earlier versions that never changed a result (what the user typed, how programs were laid
out) never block a resume."""
import json

import pytest

from f2m_jax import registry
from f2m_jax import workdir


def test_workdirs_older_than_a_field_resume_only_with_its_old_behaviour():
  current = {'data': {'split': ''}, 'noise': {'pf_gradient': False, 'bn_updates': 'all_passes'}}
  before_split = {'data': {}, 'noise': {'pf_gradient': False, 'bn_updates': 'all_passes'}}
  assert workdir.config_differences(before_split, current) == []
  before_switches = {'data': {}, 'noise': {}}  # written before the authors' behaviours were fields
  assert workdir.config_differences(before_switches, current) == ['noise.bn_updates', 'noise.pf_gradient']
  paper = {'data': {'split': ''}, 'noise': {'pf_gradient': True, 'bn_updates': 'clean'}}
  assert workdir.config_differences(before_switches, paper) == []
  # Written before Eq. 5's prototypes could be normalised: they were raw.
  assert workdir.config_differences({'incremental': {}}, {'incremental': {'prototype_norm': 'raw'}}) == []
  for norm in ('unit_base', 'unit_all'):
    assert workdir.config_differences({'incremental': {}}, {'incremental': {'prototype_norm': norm}}) == [
        'incremental.prototype_norm']


def test_a_methods_own_section_is_compared_only_for_that_method():
  sections = registry.method_sections()
  assert sections['crt'] == 'crt'
  differences = lambda saved, now: workdir.config_differences(saved, now, method_sections=sections)
  current = {'method': 'f2m', 'crt': {'lr': 0.1, 'epochs': 17}}
  assert differences({'method': 'f2m'}, current) == []  # written before cRT existed
  assert differences({'method': 'f2m', 'crt': {'lr': 0.5, 'epochs': 17}}, current) == []
  crt = {'method': 'crt', 'crt': {'lr': 0.1, 'epochs': 17}}
  assert differences({'method': 'crt', 'crt': {'lr': 0.5, 'epochs': 17}}, crt) == ['crt.lr']
  assert differences({'method': 'f2m'}, crt) == ['crt.epochs', 'crt.lr', 'method']


def test_a_renamed_field_in_a_saved_config_reads_as_the_new_one():
  """Workdirs written with noise.clean_backward (True was the default then) resume under
  noise.backward_weights='clean', and only under it."""
  saved = {'noise': {'clean_backward': True}}
  assert workdir.config_differences(saved, {'noise': {'backward_weights': 'clean'}}) == []
  assert workdir.config_differences(saved, {'noise': {'backward_weights': 'noisy'}}) == ['noise.backward_weights']
  assert workdir.config_differences({'noise': {'clean_backward': False}}, {'noise': {'backward_weights': 'noisy'}}) == []
  assert workdir.config_differences({'noise': {}}, {'noise': {'backward_weights': 'noisy'}}) == []  # older still
  # incremental.normalize_base_prototypes (issue 40) became incremental.prototype_norm: True was 'unit_base'.
  for old, new in ((False, 'raw'), (True, 'unit_base')):
    saved = {'incremental': {'normalize_base_prototypes': old}}
    for norm in ('raw', 'unit_base', 'unit_all'):
      want = [] if norm == new else ['incremental.prototype_norm']
      assert workdir.config_differences(saved, {'incremental': {'prototype_norm': norm}}) == want


def test_a_removed_field_resumes_only_with_the_value_the_code_still_computes(tmp_path):
  """noise.pf_classes is gone and the code computes what 'batch' did: a config.json holding 'batch'
  resumes and evaluates as a current one; one holding 'all_base' is refused, naming the field, the
  saved value and the value the code computes."""
  now = {'method': 'f2m', 'noise': {'bound': 0.005, 'pf_weight': 1.0}}
  batch = {'method': 'f2m', 'noise': {'bound': 0.005, 'pf_weight': 1.0, 'pf_classes': 'batch'}}
  all_base = {'method': 'f2m', 'noise': {'bound': 0.005, 'pf_weight': 1.0, 'pf_classes': 'all_base'}}
  assert workdir.config_differences(batch, now) == []
  assert workdir.config_differences(all_base, now) == ['noise.pf_classes']
  # other differences are still found beside a dropped removed field
  assert workdir.config_differences({'method': 'f2m', 'noise': {'pf_classes': 'batch', 'bound': 0.01, 'pf_weight': 1.0}},
                                    now) == ['noise.bound']
  for name, saved in (('batch', batch), ('all_base', all_base)):
    folder = tmp_path / name
    folder.mkdir()
    (folder / 'config.json').write_text(json.dumps(saved))
    if name == 'batch':
      workdir.prepare(str(folder), now)  # resumes: no error
      assert 'pf_classes' not in workdir.saved_config(str(folder), now)['noise']
    else:
      with pytest.raises(workdir.WorkdirError) as error:
        workdir.prepare(str(folder), now)
      message = str(error.value)
      assert "noise.pf_classes: saved 'all_base', a field since removed" in message
      assert "noise.pf_classes='batch'" in message
      # read as a source (--checkpoint), the value stays, so its differences name it
      assert workdir.saved_config(str(folder), now)['noise']['pf_classes'] == 'all_base'


def test_saved_config_fills_fields_added_later(tmp_path):
  (tmp_path / 'config.json').write_text(json.dumps({'method': 'f2m', 'noise': {'bound': 0.01}}))
  defaults = {'method': 'f2m', 'noise': {'bound': 0.005, 'pf_gradient': False}, 'crt': {'lr': 0.1}}
  assert workdir.saved_config(str(tmp_path), defaults) == {
      'method': 'f2m', 'noise': {'bound': 0.01, 'pf_gradient': True, 'bn_updates': 'clean', 'backward_weights': 'noisy'},
      'incremental': {'prototype_norm': 'raw'},
      'crt': {'lr': 0.1}, 'data': {'split': '', 'synthetic': {'seed': 0}}, 'base': {'select_on_test': False, 'select_every': 1500},
      'model': {'head': 'linear'}, 'icarl': {'exemplars': 'herding'},
      'rebalance': {'exemplars': 'herding', 'classifier': 'nearest_mean'}}


def test_fields_of_earlier_versions_that_changed_no_result_never_block_a_resume():
  saved = {'method': 'baseline', 'eval': {'normalize_prototypes': False}, 'set_by_user': ['method'],
           'compile_ahead': 'auto', 'base': {'data_placement': 'auto', 'prefetch': 2, 'steps_per_call': 0},
           'incremental': {'parallel_runs': 0}, 'noise': {'draw_map': 'auto'}, 'members': {'map': 'auto'}}
  now = {'method': 'baseline', 'eval': {'normalize_prototypes': False}, 'base': {'steps_per_call': 20},
         'incremental': {}, 'noise': {'draw_map': 'unroll'}, 'members': {'map': 'unroll'},
         'model': {'conv_backward': 'cpu'}}
  assert workdir.config_differences(saved, now) == []
  now['eval']['normalize_prototypes'] = True
  assert workdir.config_differences(saved, now) == ['eval.normalize_prototypes']
