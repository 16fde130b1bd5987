"""Kernel families: one module per family (config dataclass, rules, ABI, launch arguments, named configs).

A family module registers its config class in ``blackwell_sparsek.config.FAMILIES`` when imported.
"""
