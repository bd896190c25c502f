"""The Hydra configs of AST-T5, installed as the ``ast_t5_configs`` package (data files only):
``pretrain/`` (with ``run_config/``) and ``finetune/``. The Hydra plugin in
``hydra_plugins/ast_t5_hydra`` puts them on the search path, so ``--config-name NAME`` works from
any directory."""
