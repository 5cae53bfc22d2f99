# Derive the per-seed ymls from the released CIFAR F2M base yml by exact string replacements.
src = '/work/oracle/authors/F2M/options/train/cifar/FSIL/FSIL_train_res18_cifar_CFRPModel_AG_ProtoFix_SGD_01.yml'
t0 = open(src).read()
for seed in (0, 1, 2):
    reps = [
        ("name: CFRPModel_res18_cifar_{DB:4}{sfc4:0.01}{PTFix:1.0}{rdt2}{BathchSize:256}{std:2.0}_60base_wandb_001",
         f"name: oracle_F2M_trainsplit_it1002_seed{seed}"),
        ("manual_seed: 1997", f"manual_seed: {seed}"),
        ("dataroot: DataSet/cifar-100/train", "dataroot: /work/oracle/authors/data/cifar100_trainsplit/train"),
        ("dataroot: DataSet/cifar-100/test", "dataroot: /work/oracle/authors/data/cifar100_trainsplit/test"),
        ("milestones: [ !!python/object/apply:eval [ 5000 * 3 ]]", "milestones: [ 500 ]"),
        ("  epoch: 10000\n", "  epoch: 333\n"),
        ("  val_freq: 1500\n", "  val_freq: 250\n"),
        ("  save_checkpoint_freq: 20000\n", "  save_checkpoint_freq: 100000\n"),
        ("  use_tb_logger: true\n", "  use_tb_logger: false\n"),
        ("    project: F2M-Noise-Cifar-60bases\n", "    project: ~\n"),
    ]
    t = t0
    for a, b in reps:
        assert t.count(a) == 1, a
        t = t.replace(a, b)
    open(f'/work/oracle/authors/configs/F2M_trainsplit_it1002_seed{seed}.yml', 'w').write(t)
