"""Fields shared by every dataset config and the smoke shrinking (values are checked by
f2m_jax/validation.py and each method's `validate` when a run starts). Imports ml_collections only:
loading a config imports neither JAX nor a method."""
import ml_collections

# The settings of the methods that own a config section (f2m_jax/methods/<section>.py reads them):
# the authors' re-implementations with the values of their CIFAR-100 YAMLs (docs/method.md, 'The
# compared methods', says where each comes from and what differs).
# iCaRL (their incremental_res18_cifar_iCaRL_5shots_SGD.yml): `memory` exemplars per class, chosen by
# `exemplars` ('herding' as theirs on CIFAR-100 and miniImageNet, or 'random': `memory` drawn per class,
# their CUB value); each session `epochs` epochs of shuffled batches over memory + shots (remainder
# dropped), SGD with the rate x lr_gamma after each milestone epoch. Its base session is its own
# (method=icarl sets model.head='linear_no_bias', their bias-free classifier). color_jitter s > 0: the
# sessions' training images (not the base session's) also get torchvision's ColorJitter(s, s, s), as their
# miniImageNet configs of iCaRL, Rebalance and FSLL (s = 0.4, configs/mini.py); 0: none, as the rest.
ICARL = dict(memory=2, exemplars='herding', epochs=90, batch_size=120, lr=0.1, milestones=(50, 70), lr_gamma=0.1,
             momentum=0.9, weight_decay=5e-4, color_jitter=0.0)
# cRT: the classifier's retraining (the original's CIFAR-100 schedule: 17 epochs of max-class-size x
# classes samples, lr 0.1 x 0.5 after epochs 8, 12 and 14; 4 images per visit of a class).
# method=joint trains every session's network with the base.* budget, as the Baseline (theirs: 241
# epochs, the rate cut after epoch 120; docs/method.md gives the override).
CRT = dict(epochs=17, lr=0.1, milestones=(8, 12, 14), lr_gamma=0.5, per_class=4, batch_size=256, momentum=0.9,
           weight_decay=5e-4)
# Rebalance (LUCIR) as their incremental_res18_cifar_NCM_5shots_SGD.yml runs it (its loss block is what
# their methods/Rebalance_model.py reads): iCaRL's memory and session schedule, the memory drawn at
# random (their `random: true`); less-forget weight lambda_base x sqrt(old / new classes) (4 on
# CIFAR-100, their miniImageNet 3 and CUB 5; LUCIR's paper 5), margin ranking of each old-class
# image's cosine against the K highest new-class cosines with `margin`, times `weight`; classified by
# `classifier`: 'cosine' (the cosine classifier's argmax over the seen classes, their `test_type: CNN`)
# or 'nearest_mean' (nearest mean of exemplars, as iCaRL).
REBALANCE = {**ICARL, 'exemplars': 'random', 'lambda_base': 4.0, 'K': 2, 'margin': 0.5, 'weight': 1.0,
             'classifier': 'cosine'}
# FSLL: tensors with max |value| <= threshold fine-tuned for `epochs` TaskSampler epochs (way x shots
# per batch); loss = triplet + pn_weight x prototype loss (cosine, scale omega) + reg_weight x L1
# drift, the drift without gradient as their code adds it (reg_gradient=True: with). Their milestone
# (160 steps) is never reached. color_jitter: as iCaRL's.
FSLL = dict(threshold=0.4, epochs=15, lr=1e-3, momentum=0.9, weight_decay=5e-4, margin=0.0, pn_weight=1.0,
            omega=1.0, reg_weight=5.0, reg_gradient=False, color_jitter=0.0)
METHOD_SECTIONS = {'crt': CRT, 'icarl': ICARL, 'rebalance': REBALANCE, 'fsll': FSLL}


def parse_arg(arg: str, allowed) -> str:
  if arg not in allowed:
    raise ValueError(f'config argument {arg!r} is not one of {[a for a in allowed if a]} (or none)')
  return arg


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # 'f2m', 'baseline' (no noise, no fine-tuning, NCM with raw prototypes), 'joint' (per session a new
  # network, from model.pretrained where set as on CUB, on all data seen so far), 'crt' (joint's
  # networks, classifier retrained from session 2 on; --checkpoint JOINT_WORKDIR), 'icarl' (exemplar
  # memory, distillation, nearest mean of exemplars), 'rebalance' (LUCIR: cosine classifier, less-forget
  # and margin-ranking losses) or 'fsll' (small-magnitude tensors fine-tuned with triplet + prototype losses);
  # f2m_jax/methods, listed in f2m_jax/registry.py. A method other than F2M replaces some of the
  # values below with its own (its `presets`, e.g. the Baseline: no noise, no fine-tuning, no PN,
  # shuffled batches) when the run starts (f2m_jax/run/pipeline.py: resolve), except those set on the
  # command line (`--config.method=baseline --config.eval.normalize_prototypes=True` is the Baseline
  # with PN).
  c.method = 'f2m'
  c.seed = 0
  c.runs = 10  # R: F2M-style draws of the shots (all runs share the base model)

  c.data = ml_collections.ConfigDict()
  c.data.dataset = ''
  c.data.source = ''  # 'tfds', 'trainsplit', 'folder', 'synthetic'
  # 'draws' (seeded shots per run), 'topic' (fixed lists, identical runs) or 'validation' (the base
  # classes' training images only, split into pseudo-base and pseudo-novel classes with held-out
  # images as their test set: f2m_jax/data/holdout.py; to choose settings without a test image)
  c.data.protocol = 'draws'
  c.data.shots = 5
  # CIFAR-100 only: '' (60 base classes + 8 sessions, TOPIC order), the paper's appendix class
  # splits 'superclass1' / 'superclass2' (6 base superclasses + 4 sessions of one superclass; draws
  # only) or 'incremental50' (plain class-incremental: configs/cifar100_incremental.py)
  c.data.split = ''
  c.data.data_dir = ''  # empty: $F2M_DATA_DIR
  c.data.tfds_data_dir = ''  # a prepared TFDS cifar100's folder; empty: $TFDS_DATA_DIR or ~/tensorflow_datasets
  c.data.cache_dir = ''  # empty: $F2M_CACHE_DIR or ~/.cache/f2m_jax
  # data.source='synthetic': generated images; `seed` is the data's own (a run's seed changes its
  # training, not its data, as with real data: runs of several seeds see the same images)
  c.data.synthetic = ml_collections.ConfigDict(dict(
      num_base=60, way=5, num_sessions=9, train_per_class=40, test_per_class=20, image_size=32, seed=0))

  c.model = ml_collections.ConfigDict()
  c.model.arch = ''
  c.model.width = 0  # 0: the architecture's standard width
  c.model.dtype = 'float32'  # compute dtype: 'float32' or 'bfloat16' (params stay float32)
  c.model.pretrained = ''  # a torchvision .pth state dict (ResNet-18 only)
  # or 'linear_no_bias' (the authors' iCaRL classifier: method=icarl sets it) or 'cosine' (LUCIR's:
  # method=rebalance sets it)
  c.model.head = 'linear'
  # How the convolutions' gradients are written: 'cpu' (the forms XLA:CPU runs fast), 'xla' (XLA's
  # own), or 'auto': 'cpu' on a CPU, 'xla' elsewhere (f2m_jax/run/backend.py, the one place that decides).
  c.model.conv_backward = 'auto'

  c.base = ml_collections.ConfigDict()
  c.base.steps = 0
  # 'task_epochs' (the original's TaskSampler: per epoch all base classes in a random order, `shots`
  # images each, class-contiguous, cut into batches of batch_size, remainder dropped), 'balanced'
  # (per step `ways` random classes x `shots` images) or 'shuffle' (plain shuffled batches)
  c.base.sampler = 'task_epochs'
  # Classes per batch of 'task_epochs' and 'balanced', kept at any batch size (the authors' 16 x 16 at
  # 256): `shots` images each, 0 meaning batch_size / ways (16 here; a batch of 64 takes 4 of each).
  # A shots set must make ways x shots = batch_size under 'task_epochs' (data/protocol.py: sampler_shots).
  c.base.ways = 16
  c.base.shots = 0
  c.base.batch_size = 256  # 'task_epochs' and 'shuffle'
  # Base-model selection on the base classes' *test* images, as the original's train.py: every
  # select_every steps the linear classifier's accuracy on them is measured and the best model kept.
  # With method=joint also each later session's network, on the test images of every class seen so
  # far, as their train_upper_bound.py (and so cRT's, which retrains those networks' classifiers).
  # Off by default (it reads the test set); every output of a run that uses it says so. One interval
  # for every method here; theirs differ by method and dataset (docs/method.md, the one list, row 1).
  c.base.select_on_test = False
  c.base.select_every = 1500
  c.base.lr = 0.1
  c.base.classifier_lr = -1.0  # < 0: same as lr
  c.base.momentum = 0.9
  c.base.weight_decay = 5e-4
  c.base.milestones = ()
  c.base.lr_gamma = 0.1
  # Steps per call of the base program (lax.scan; the training images stay on the devices and each
  # step gathers its batch there), reduced to divide log_every and checkpoint_every
  # (f2m_jax/train_loop.py: steps_per_call).
  c.base.steps_per_call = 20
  c.base.log_every = 50
  c.base.checkpoint_every = 500

  c.noise = ml_collections.ConfigDict()
  c.noise.enabled = True  # FM: flat-minima noise in base training
  c.noise.num_layers = 4  # K: the last K 3x3 convs form the noise set
  c.noise.M = 2
  # b: the true noise half-width and the clamp box half-width (the original's config value
  # bound_value is 2b: its noise and its clamp reach bound_value / 2). 0.005 is the released CIFAR-100
  # configs' bound_value 0.01; the paper's text says b = 0.01, its Table 6 puts its CIFAR-100 numbers
  # at b = 0.02 (docs/method.md, 'b on CIFAR-100')
  c.noise.bound = 0.005
  # 'discrete_beta' (the original's sampler as it runs: levels {-b, 0, b/2, b}, mean +0.235 b),
  # 'grid' (the same five levels {-b, -b/2, 0, b/2, b} all reachable, symmetric) or 'uniform' on
  # [-b, b]; the paper states no law for the noise, only its bound
  c.noise.distribution = 'discrete_beta'
  c.noise.prototype_fixing = True  # PF
  c.noise.pf_weight = 1.0  # lambda (the original's 1.0; the paper gives no value)
  # False: PF's value enters the loss without gradient (the original), so PF acts only through the
  # std term's values, and with std_weight 0 not at all; True: the paper (with std_weight > 0 it
  # diverged within 79 steps: docs/method.md, the ablation switches)
  c.noise.pf_gradient = False
  c.noise.std_weight = 2.0  # gamma: + gamma * std over the M noisy losses (the original; the paper has none: 0)
  # 'all_passes': BN running statistics updated by the clean pass, then by each noisy pass in turn
  # (the original, 1 + M updates per step); 'clean': by the clean pass only
  c.noise.bn_updates = 'all_passes'
  # The weights the noisy passes are differentiated at: 'noisy' (the exact gradient at phi + eps_j,
  # Eq. 3, and what the authors' code computed on the PyTorch of the paper's runs, <= 1.9) or 'clean'
  # (their code on PyTorch >= 1.10, which saves leaves by reference, so the backward sees the clean
  # weights they restore into p.data before it; docs/method.md)
  c.noise.backward_weights = 'noisy'
  c.noise.shared_trunk = True  # run the unperturbed trunk once per batch
  # How the M noisy passes share one program: 'vmap', 'unroll' (written out) or 'auto': unroll on a
  # CPU, vmap elsewhere (f2m_jax/run/backend.py)
  c.noise.draw_map = 'auto'
  # Weight of the clean pass's cross-entropy in the base loss: 0 leaves it out, as the authors' loss does
  c.noise.clean_ce_weight = 0.0

  c.incremental = ml_collections.ConfigDict()
  c.incremental.finetune = True
  c.incremental.trainable = 'noise_set'  # or 'all' (all of phi)
  c.incremental.steps = 6
  c.incremental.lr = 0.01
  c.incremental.momentum = 0.9
  c.incremental.weight_decay = 5e-4
  c.incremental.clamp = True  # PC
  c.incremental.distance = 'squared_euclidean'  # or 'euclidean'
  c.incremental.round_steps = True  # the original's rounding of each SGD step to multiples of b/2
  # The norm of Eq. 5's prototypes: 'raw' (the original), 'unit_base' (the stored base prototypes at
  # unit L2 norm, as Algorithm 1 saves them; the batch's class means raw) or 'unit_all' (every
  # prototype at unit norm, as NCM with PN compares them). Test-time PN is eval.normalize_prototypes.
  c.incremental.prototype_norm = 'raw'

  # Each method's own section (crt, icarl, rebalance, fsll): METHOD_SECTIONS above.
  for section, values in METHOD_SECTIONS.items():
    c[section] = ml_collections.ConfigDict(values)

  # Several runs of this config in one program (f2m_jax/run/members.py): `seeds` (members differing in
  # their seed), or `field` ('noise.bound') with `field_values` (members differing in that field). Each
  # member trains its base session in one jitted step with all the others, then its sessions; the
  # workdir holds member_<i>/ workdirs and summary.json. `map`: 'unroll' (the members side by side in
  # one program) or 'vmap' (over the member axis); which is faster on a GPU is unmeasured
  # (docs/performance.md).
  c.members = ml_collections.ConfigDict(dict(seeds=(), field='', field_values=(), map='unroll'))

  c.eval = ml_collections.ConfigDict()
  c.eval.normalize_prototypes = True  # PN
  c.eval.batch_size = 500
  c.eval.cache_trunk = True  # evaluate fine-tuned suffixes on cached frozen-trunk test features

  c.flatness = ml_collections.ConfigDict()  # --mode flatness (the paper's flatness table)
  c.flatness.num_draws = 1000
  c.flatness.chunk = 50  # draws evaluated together under vmap
  c.flatness.max_images = 0  # 0: every base training / base test image; else a seeded subset
  c.flatness.bound = -1.0  # < 0: noise.bound

  # Devices: a 1-D data-parallel mesh over all devices (f2m_jax/sharding.py); the global batch above
  # is split over them. One host with several GPUs or a TPU host: nothing to set. Several hosts: set
  # JAX_COORDINATOR_ADDRESS (and JAX_NUM_PROCESSES, JAX_PROCESS_ID), or distributed=True where a
  # cluster manager (SLURM, a TPU pod) lets JAX find its peers; run the same command on every host.
  c.distributed = False
  # TensorBoard scalars (base-training curves, each run's sessions) in <workdir>/tensorboard/,
  # beside metrics.jsonl: `pip install tensorboard`, then `tensorboard --logdir <workdir>`. Costs nothing
  # measurable.
  c.tensorboard = True
  # JAX's persistent compilation cache in <cache folder>/jax_compilation_cache (data.cache_dir, else
  # $F2M_CACHE_DIR, else ~/.cache/f2m_jax): a repeated run of a config loads its compiled programs
  # instead of compiling them, with the same results.
  # JAX_COMPILATION_CACHE_DIR, where set, is used instead. --mode bench never turns it on (it times
  # compiling).
  c.compilation_cache = True
  # Sizes checked against this machine's memory when a run starts (f2m_jax/run/memory.py): a run whose
  # estimate exceeds the machine's total memory is refused, one that exceeds what is free now is warned
  # about. False skips the check (e.g. where the estimate is known to be too high for a config).
  c.memory_check = True

  # --mode bench (f2m_jax/run/bench.py); the values fit a CPU. On a GPU the scripts in experiments/ time more:
  # M_list (1, 2, 4, 8), dtypes ('float32', 'bfloat16'), other_draw_map=True; S members against S single
  # runs: experiments/bench_members.py.
  c.bench = ml_collections.ConfigDict()
  c.bench.M_list = (2, 4)
  c.bench.dtypes = ('float32',)
  c.bench.other_draw_map = False  # also time the draw mapping that noise.draw_map does not pick
  c.bench.warmup = 1
  c.bench.iters = 5
  c.bench.batch = 0  # 0: the base-session batch (base.ways x base.shots, or base.batch_size)
  return c


def folder_section() -> ml_collections.ConfigDict:
  """data.folder: the folder source's fields (f2m_jax/data/folder.py, docs/data.md 'Your own images').
  Paths may use ~ and $VARIABLES (e.g. '$F2M_DATA_DIR/birds/train')."""
  return ml_collections.ConfigDict(dict(
      train='',  # a folder with one subfolder of images per class, or a CSV of path,label[,split]
      test='',  # the test images the same way ('' where the CSV's split column or test_per_class gives them)
      class_depth=0,  # a folder's class: 0 the image's folder (its path under train/test), k its first k levels
      test_per_class=0,  # > 0: that many images of each class of `train` are its test images instead
      split_by='first',  # those test images: 'first' (a folder's sorted paths, a CSV's rows) or 'random' (by split_seed)
      split_seed=0,
      root='',  # the folder a CSV's relative paths start from ('': the CSV's own folder)
      classes='',  # '' (the sorted class names) or a file listing the class names in order
      lists='',  # '' or a folder of TOPIC-style lists session_1.txt .. session_<num_sessions>.txt
      num_base=0,  # classes in session 1 (0: every class no later session takes)
      way=5,  # classes each later session brings
      num_sessions=9,  # sessions, the base session included
      resize=8 / 7,  # stored training images and the test Resize: round(data.image_size x resize) pixels
      augment='rrc_flip'))  # or 'crop_flip' (pad-4 crops, for small images; needs resize=1)


def make_cpu(c: ml_collections.ConfigDict) -> None:
  """A budget a 2-core CPU trains in minutes, its fields set together (the `:cpu` of every dataset
  config): 1,000 base steps of batch 64 (base.ways classes a batch, base.batch_size / base.ways = 4
  images each: base.shots=0), lr 0.05 (x base.lr_gamma from step 700), 5 runs of the shots; a
  ResNet-18 at 32 px with width 16 (a quarter of its channels; CIFAR's ResNet-20 stays as it is)."""
  c.base.update(steps=1000, milestones=(700,), batch_size=64, lr=0.05, log_every=50, checkpoint_every=250)
  c.runs = 5
  if c.model.arch == 'resnet18':
    c.model.width = 16
    c.data.image_size = 32


def make_smoke(c: ml_collections.ConfigDict) -> None:
  """Shrinks a config to a synthetic run of well under a minute on a CPU, same code path: 20 base
  classes + 8 sessions of 2-way 5-shot, 16x16 images, a width-8 network, 100 base steps, 2 runs."""
  c.data.source = 'synthetic'
  c.data.synthetic.update(num_base=20, way=2, num_sessions=9, train_per_class=40, test_per_class=20,
                          image_size=16)
  c.model.width = 8
  c.runs = 2
  c.base.steps = 100
  c.base.ways = 10  # x 8 images
  c.base.batch_size = 80
  c.base.milestones = (80,)
  c.base.lr_gamma = 0.1
  c.base.log_every = 10
  c.base.checkpoint_every = 25
  c.eval.batch_size = 250
  c.bench.M_list = (1, 2)
  c.bench.iters = 3
  for section in ('icarl', 'rebalance'):  # a few short epochs per session
    c[section].update(epochs=4, milestones=(2,), batch_size=32)
  c.crt.update(epochs=2, milestones=(1,), batch_size=40)
