"""Framework integrations: each module imports its framework, so none is loaded by
``import stallscope``; import the one you train with (docs/integrations.md).

- ``stallscope.integrations.lightning``: ``StallscopeCallback`` for PyTorch Lightning.
- ``stallscope.integrations.huggingface``: ``StallscopeCallback`` for transformers'
  ``Trainer`` and ``watch_prepared`` for loaders returned by ``accelerator.prepare``.
"""
