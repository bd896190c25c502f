"""Parse-error ratios of real C and C++ headers, before and after the header measures.

Measures, per language, the distribution of the error ratio over this machine's headers:

* ``before``: the grammar of the extension (``.h`` -> C), every byte under an ERROR node counted
  (the old default, which skipped files above 0.05);
* ``macros``: declaration macros blanked and ``.h`` tried with both grammars, every ERROR byte
  still counted;
* ``after``: what the pipeline does now (parsing.py): declaration macros blanked when a file has
  errors, ``.h`` files tried with the C++ grammar too, and only the ERROR bytes that no valid
  subtree covers counted (the ``spans`` policy).

    python benchmarks/measure_headers.py                       # /usr/include + libstdc++
    python benchmarks/measure_headers.py --c-dir DIR --cpp-dir DIR

It prints quantiles and the share of files kept at several thresholds; the per-language default
threshold (parsing.DEFAULT_MAX_ERROR_RATIO) comes from this table (BENCHMARKS.md).
"""
import argparse
import glob
import os
import sys

import numpy as np

from ast_t5_preprocess.parsing import CodeParser

THRESHOLDS = (0.0, 0.05, 0.2, 0.5)


def header_sets(c_dir: str, cpp_dir: str):
    """``{"c": [paths], "cpp": [paths]}``: top-level C headers, and every libstdc++ header."""
    c = sorted(glob.glob(os.path.join(c_dir, "*.h")))
    cpp = sorted(p for p in glob.glob(os.path.join(cpp_dir, "**", "*"), recursive=True) if os.path.isfile(p))
    return {"c": c, "cpp": cpp}


def best_parse(data, path, language, parsers, spans):
    parsed, lang = parsers[language].parse(data, None, spans), language
    if parsed.has_error and language == "c" and path.endswith(".h"):
        other = parsers["cpp"].parse(data, None, spans)
        if other.error_ratio < parsed.error_ratio:
            parsed, lang = other, "cpp"
    return parsed, lang


def measure(paths, language, parsers):
    """Error ratios per file: before, with macros blanked and both grammars (every ERROR byte
    counted), after (the spans policy too); and the grammar chosen."""
    before, macros, after, chosen = [], [], [], []
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        before.append(parsers[language]._parse_once(data, None, False).error_ratio)
        macros.append(best_parse(data, path, language, parsers, False)[0].error_ratio)
        parsed, lang = best_parse(data, path, language, parsers, True)
        after.append(parsed.error_ratio)
        chosen.append(lang)
    return np.array(before), np.array(macros), np.array(after), chosen


def table(name, ratios):
    q = np.quantile(ratios, [0.5, 0.9, 0.95, 0.99, 1.0]) if len(ratios) else [0] * 5
    kept = "  ".join(f"<={t:g}: {np.mean(ratios <= t) * 100:5.1f}%" for t in THRESHOLDS)
    return (f"  {name:<7} files {len(ratios):4d}  median {q[0]:.3f}  p90 {q[1]:.3f}  p95 {q[2]:.3f}  "
            f"p99 {q[3]:.3f}  max {q[4]:.3f}  kept {kept}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--c-dir", default="/usr/include")
    cxx = sorted(glob.glob("/usr/include/c++/*"))
    ap.add_argument("--cpp-dir", default=cxx[-1] if cxx else "/usr/include/c++")
    args = ap.parse_args(argv)
    sets = header_sets(args.c_dir, args.cpp_dir)
    if not sets["c"] and not sets["cpp"]:
        sys.exit(f"no headers under {args.c_dir} or {args.cpp_dir}")
    parsers = {"c": CodeParser("c"), "cpp": CodeParser("cpp")}
    print(f"C headers: {args.c_dir}/*.h; C++ headers: every file under {args.cpp_dir}")
    for lang, paths in sets.items():
        before, macros, after, chosen = measure(paths, lang, parsers)
        print(f"{lang}:")
        print(table("before", before))
        print(table("macros", macros))
        print(table("after", after))
        if lang == "c":
            print(f"  .h files parsed better as C++: {chosen.count('cpp')}")


if __name__ == "__main__":
    main()
