"""Hydra plugin hook of AST-T5: lets `fairseq-hydra-train` find the plugin from any directory.

Hydra imports every module under the ``hydra_plugins`` namespace package when it starts. This
one registers the OmegaConf resolver ``ast_t5_user_dir``, which our configs use as
``common.user_dir: ${ast_t5_user_dir:}``: it resolves to the directory of the installed
``ast_t5`` package, so fairseq imports the plugin (in every rank and in spawned workers, which
receive the resolved path) without PYTHONPATH tricks or absolute paths in the configs. Nothing
heavy is imported here.
"""
import importlib.util
import os
import sys

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf

RESOLVER = "ast_t5_user_dir"


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


class AstT5SearchPathPlugin(SearchPathPlugin):
    """Registered only so Hydra loads this module; it adds no config source."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        return None
