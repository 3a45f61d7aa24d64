"""Data: benchmark file loaders (``gmts.data.datasets``) and prompt templates
(``gmts.data.prompts``). Nothing heavy is imported here; import the submodule you need."""
