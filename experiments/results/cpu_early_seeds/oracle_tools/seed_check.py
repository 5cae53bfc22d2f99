# Replicates train.py's RNG order (set_random_seed -> dataset/sampler/loader -> create_model -> first batch)
# with the authors' modules, for two seeds, to show that the seed changes the init and the batches.
import sys, os, hashlib
sys.path.insert(0, '/work/oracle/authors/F2M'); os.chdir('/work/oracle/authors/F2M')
import numpy as np, torch, logging
from utils.options import parse
from utils import set_random_seed, get_root_logger
from data import create_dataloader, create_dataset, create_sampler
from methods import create_model
get_root_logger(logger_name='FS-IL', log_level=logging.WARNING)
for seed in (0, 1, 2):
    opt = parse(f'/work/oracle/authors/configs/F2M_trainsplit_it1002_seed{seed}.yml', is_train=True)
    opt['rank'] = 0; opt['world_size'] = 1; opt['wandb_logger'] = None
    set_random_seed(opt['manual_seed']); torch.set_num_threads(1)
    perm = np.arange(100); sel = perm[:60]
    d = opt['datasets']['train']; d['all_classes'] = perm; d['selected_classes'] = sel
    d['sampler']['num_classes'] = 60; d['batch_size'] = d['batch_size_base_classes']; d['task_id'] = 0
    d['pre_load'] = False  # only to save time here: pre-loading draws no random numbers
    ts = create_dataset(d, info=False); sm = create_sampler(ts, d['sampler'])
    dl = create_dataloader(ts, d, sampler=sm, seed=seed)
    model = create_model(opt)
    w = model.net_g.conv1.weight.detach() if hasattr(model.net_g, 'conv1') else next(model.net_g.parameters()).detach()
    first = next(iter(dl))
    print(f'seed {seed}: first-param sum {w.sum().item():.6f}; last-linear.weight[0,:3] {[round(v,6) for v in list(model.net_g.parameters())[-2][0,:3].tolist()]}; '
          f'first batch labels[:20] {first[1][:20].tolist()} image-sum {first[0].sum().item():.3f}')
