"""Hydra plugin hook of AST-T5: lets `fairseq-hydra-train` find the plugin and its configs from any
directory.

Hydra imports every module under the ``hydra_plugins`` namespace package when it starts. This
one

* registers the OmegaConf resolver ``ast_t5_user_dir``, which our configs use as
  ``common.user_dir: ${ast_t5_user_dir:}``: it resolves to the directory of the installed
  ``ast_t5`` package, so fairseq imports the plugin (in every rank and in spawned workers, which
  receive the resolved path) without PYTHONPATH tricks or absolute paths in the configs;
* adds the installed configs (``config/pretrain``, ``config/finetune``) and our Hydra job-logging
  config (console only) to the search path, after any ``--config-dir``, so
  ``fairseq-hydra-train --config-name tiny ...`` works from any directory;
* under ``fairseq-hydra-train`` only: refuses an unknown ``--config-name`` in one line with the
  close matches (fairseq stores its default schema under whatever name is asked for, so a typo
  would otherwise train fairseq's defaults), and silences Hydra's warnings about fairseq's own
  1.0-style setup (schema matching, version_base), which a user cannot act on.

Nothing heavy is imported here.
"""
import difflib
import importlib.util
import os
import sys
import warnings
from typing import List, Optional

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

RESOLVER = "ast_t5_user_dir"
PROG = "fairseq-hydra-train"
CONFIG_GROUPS = ("pretrain", "finetune")
HERE = os.path.dirname(os.path.abspath(__file__))
FAIRSEQ_DEFAULT_CONFIG = "config"  # fairseq's own primary config (fairseq/config/config.yaml)
# Hydra deprecation warnings caused by how fairseq_cli.hydra_train sets Hydra up (a schema stored
# under the primary config's name, no version_base): not actionable by our users.
_FAIRSEQ_WARNINGS = (r"[\s\S]*is validated against ConfigStore schema with the same name",
                     r"[\s\S]*The version_base parameter is not specified")


def ast_t5_user_dir() -> str:
    loaded = sys.modules.get("ast_t5")
    if loaded is not None and getattr(loaded, "__file__", None):
        return os.path.dirname(os.path.abspath(loaded.__file__))  # the copy already in use
    spec = importlib.util.find_spec("ast_t5")
    if spec is None or spec.origin is None:
        raise ImportError("the ast_t5 package is not installed (pip install -e . in the repository)")
    return os.path.dirname(os.path.abspath(spec.origin))


if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, ast_t5_user_dir)


def config_root() -> Optional[str]:
    """The folder holding ``pretrain/`` and ``finetune/``: the installed ``ast_t5_configs``
    package (``config/`` of the repository), else ``config/`` beside the ``ast_t5`` package (a
    source checkout on PYTHONPATH)."""
    spec = importlib.util.find_spec("ast_t5_configs")
    candidates = list(spec.submodule_search_locations or []) if spec is not None else []
    try:
        candidates.append(os.path.join(os.path.dirname(ast_t5_user_dir()), "config"))
    except ImportError:
        pass
    for root in candidates:
        if os.path.isdir(os.path.join(root, "pretrain")):
            return os.path.abspath(root)
    return None


def config_dirs() -> List[str]:
    root = config_root()
    return [os.path.join(root, g) for g in CONFIG_GROUPS if root and os.path.isdir(os.path.join(root, g))]


def config_names(dirs: List[str]) -> List[str]:
    return sorted({n[:-5] for d in dirs if os.path.isdir(d) for n in os.listdir(d) if n.endswith(".yaml")})


def unknown_config_message(name: str, config_dir: Optional[str]) -> Optional[str]:
    """One line when ``name`` is no config of ``config_dir``, of ours or fairseq's; else None."""
    dirs = ([os.path.abspath(config_dir)] if config_dir else []) + config_dirs()
    known = config_names(dirs)
    if name == FAIRSEQ_DEFAULT_CONFIG or name in known:
        return None
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    where = f"in {config_dir} or " if config_dir else "in "
    return (f"{PROG}: error: unknown --config-name {name!r} ({where}the installed configs); "
            f"{hint}known: {', '.join(known)}")


def _running_fairseq_hydra_train() -> bool:
    """True under the console script, ``python -m fairseq_cli.hydra_train`` or ``cli_main()``."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return ("fairseq_cli.hydra_train" in sys.modules
            or getattr(main_spec, "name", None) == "fairseq_cli.hydra_train")


def _check_command_line() -> None:
    """Exit 2 with one line on an unknown --config-name (only under fairseq-hydra-train)."""
    from hydra._internal.utils import get_args

    try:
        args = get_args(sys.argv[1:])
    except SystemExit:
        return  # Hydra reports its own usage errors
    if args.config_name and not args.help and not args.hydra_help:
        message = unknown_config_message(args.config_name, args.config_dir)
        if message:
            print(message, file=sys.stderr)
            sys.exit(2)


class AstT5SearchPathPlugin(SearchPathPlugin):
    """Adds our configs and job-logging config after ``--config-dir`` (which keeps priority)."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        command_line_dir = None
        if _running_fairseq_hydra_train():
            for pattern in _FAIRSEQ_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern, category=UserWarning)
            _check_command_line()
            from hydra._internal.utils import get_args

            try:
                command_line_dir = get_args(sys.argv[1:]).config_dir
            except SystemExit:
                command_line_dir = None
        if command_line_dir and os.path.isdir(command_line_dir):
            # Hydra adds --config-dir after the plugins; put it first here too so that a user's
            # own config of the same name wins over ours.
            search_path.append("ast-t5-command-line", f"file://{os.path.abspath(command_line_dir)}")
        for d in config_dirs():
            search_path.append("ast-t5", f"file://{d}")
        search_path.append("ast-t5-hydra", f"file://{os.path.join(HERE, 'conf')}")


try:
    from hydra.experimental.callback import Callback
except ImportError:  # pragma: no cover  (Hydra < 1.1 has no callbacks)
    Callback = object


class ConfigChecks(Callback):
    """Hydra callback our configs register (``hydra.callbacks.ast_t5_checks``): runs
    ``ast_t5.config_checks`` on the composed config before fairseq starts, so a wrong name, key
    or path ends the run in one line (exit 2) instead of a traceback deep in fairseq."""

    def on_job_start(self, config, **kwargs) -> None:
        from ast_t5.config_checks import run_checks_or_exit

        run_checks_or_exit(config)
