"""Backbones: ResNet-20 (CIFAR) and ResNet-18 (ImageNet stem) with a trunk/suffix split."""
from f2m_jax.models.resnet import (ARCHS, HEADS, ResNet, build_model, cosine_scores,
                                   noise_set_paths, resnet18, resnet20, split_block,
                                   uniform_columns)

__all__ = ['ARCHS', 'HEADS', 'ResNet', 'build_model', 'cosine_scores', 'noise_set_paths',
           'resnet18', 'resnet20', 'split_block', 'uniform_columns']
