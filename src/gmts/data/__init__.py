"""Data: benchmark loaders (`gmts.data.datasets`), prompt templates, built-in tasks, tiny model.

Nothing heavy is imported here; import the submodule you need.
"""
