"""Data: the named benchmarks, each registered once with files, parser, template and verifier
(``gmts.data.benchmarks``), generic dataset files (``gmts.data.datasets``) and prompt templates
(``gmts.data.prompts``). Nothing heavy is imported here; import the submodule you need."""
