"""f2m-jax: F2M (flat minima for incremental few-shot learning, NeurIPS 2021) in JAX/Flax."""
__version__ = '0.1.0'
