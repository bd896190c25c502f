"""Languages the pipeline knows: tree-sitter grammar wheels, file extensions, JSONL names.

Grammars come from pinned pip packages (``tree-sitter-python`` ...), never built at run time.
``text`` is natural language (Markdown, plain text): tokenized and segmented, but without an AST.
"""
import importlib
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

TEXT = "text"


@dataclass(frozen=True)
class LanguageSpec:
    name: str
    module: Optional[str]  # grammar package; None for text
    function: str = "language"  # function of the package returning the grammar pointer
    extensions: Tuple[str, ...] = ()


LANGUAGES: Dict[str, LanguageSpec] = {s.name: s for s in (
    LanguageSpec("python", "tree_sitter_python", extensions=(".py", ".pyi")),
    LanguageSpec("java", "tree_sitter_java", extensions=(".java",)),
    LanguageSpec("cpp", "tree_sitter_cpp",
                 extensions=(".cpp", ".cc", ".cxx", ".c++", ".hpp", ".hh", ".hxx", ".h++", ".ipp")),
    LanguageSpec("csharp", "tree_sitter_c_sharp", extensions=(".cs",)),
    LanguageSpec("c", "tree_sitter_c", extensions=(".c", ".h")),
    LanguageSpec("go", "tree_sitter_go", extensions=(".go",)),
    LanguageSpec("javascript", "tree_sitter_javascript", extensions=(".js", ".mjs", ".cjs", ".jsx")),
    LanguageSpec("typescript", "tree_sitter_typescript", "language_typescript",
                 extensions=(".ts", ".mts", ".cts")),
    LanguageSpec("tsx", "tree_sitter_typescript", "language_tsx", extensions=(".tsx",)),
    LanguageSpec("rust", "tree_sitter_rust", extensions=(".rs",)),
    LanguageSpec(TEXT, None, extensions=(".md", ".markdown", ".txt", ".rst")),
)}

EXTENSION_TO_LANGUAGE = {ext: s.name for s in LANGUAGES.values() for ext in s.extensions}

# Names used by JSONL corpora (The Stack's `lang`, GitHub linguist names) -> ours.
_ALIASES = {
    "python": "python", "py": "python", "java": "java", "c++": "cpp", "cpp": "cpp",
    "c#": "csharp", "csharp": "csharp", "c-sharp": "csharp", "c_sharp": "csharp", "c": "c",
    "go": "go", "golang": "go", "javascript": "javascript", "js": "javascript",
    "typescript": "typescript", "ts": "typescript", "tsx": "tsx", "rust": "rust", "rs": "rust",
    "python3": "python", "py3": "python", "cxx": "cpp", "cplusplus": "cpp", "cs": "csharp",
    "jsx": "javascript", "node": "javascript", "typescript-jsx": "tsx",
    "markdown": TEXT, "text": TEXT, "plain text": TEXT, "restructuredtext": TEXT, "md": TEXT,
}


def normalize_language(name: str) -> Optional[str]:
    """Map a user or corpus language name to ours, or None if unknown."""
    return _ALIASES.get(name.strip().lower()) if name else None


def language_from_path(path: str) -> Optional[str]:
    return EXTENSION_TO_LANGUAGE.get(os.path.splitext(path)[1].lower())


def load_grammar(name: str):
    """The tree-sitter ``Language`` of a language (raises for ``text`` or unknown names)."""
    from tree_sitter import Language

    spec = LANGUAGES.get(name)
    if spec is None or spec.module is None:
        raise ValueError(f"no tree-sitter grammar for language {name!r}")
    module = importlib.import_module(spec.module)
    return Language(getattr(module, spec.function)())


def grammar_version(name: str) -> str:
    """Version of the grammar wheel behind a language ("-" for text)."""
    from importlib.metadata import PackageNotFoundError, version

    spec = LANGUAGES[name]
    if spec.module is None:
        return "-"
    try:
        return version(spec.module.replace("_", "-"))
    except PackageNotFoundError:
        return "unknown"
