"""Reading a large Parquet file needs no more memory than reading a small one: the reader holds
one batch of one row group at a time. Peak RSS is measured in fresh subprocesses that run the
reading path of the pipeline (iter_documents + read_document) over a 240 MB and a 16 MB file
with the same row groups; the test compares the two peaks, not absolute figures."""
import os
import subprocess
import sys
import sysconfig

import pytest

MEASURE = r"""
import resource, sys
from ast_t5_preprocess.inputs import ReadLimits, iter_documents, read_document
limits = ReadLimits(max_line_length=10 ** 6, max_mean_line_length=10 ** 6)
n = nbytes = 0
for doc in iter_documents(sys.argv[1:]):
    data, _, _ = read_document(doc, limits)
    n, nbytes = n + 1, nbytes + len(data or b"")
print(n, nbytes, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def write_code_parquet(path, megabytes, rows_per_group=1000, row_bytes=4000):
    """A Parquet file of ``megabytes`` of real Python text (slices of difflib.py) in The Stack's
    columns, written row group by row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = open(os.path.join(sysconfig.get_paths()["stdlib"], "difflib.py"), encoding="utf-8").read() * 2
    n = int(megabytes * 1e6 // row_bytes)
    schema = pa.schema([("content", pa.string()), ("max_stars_repo_path", pa.string()), ("lang", pa.string())])
    with pq.ParquetWriter(str(path), schema) as w:
        for start in range(0, n, rows_per_group):
            idx = range(start, min(n, start + rows_per_group))
            off = [(i * 37) % (len(base) - 2 * row_bytes) for i in idx]
            w.write_table(pa.table({"content": [f"# {i}\n" + base[o:o + row_bytes] for i, o in zip(idx, off)],
                                    "max_stars_repo_path": [f"repo/f{i}.py" for i in idx],
                                    "lang": ["Python"] * len(idx)}, schema=schema),
                          row_group_size=rows_per_group)
    return n


def peak_rss_kib(path):
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True,
                         check=True, timeout=600)
    n, nbytes, rss = map(int, out.stdout.split())
    return n, nbytes, rss


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux")
def test_large_parquet_reads_in_the_memory_of_a_small_one(tmp_path):
    rows_small = write_code_parquet(tmp_path / "small.parquet", 16)
    rows_big = write_code_parquet(tmp_path / "big.parquet", 240)
    n_small, bytes_small, rss_small = peak_rss_kib(tmp_path / "small.parquet")
    n_big, bytes_big, rss_big = peak_rss_kib(tmp_path / "big.parquet")
    assert (n_small, n_big) == (rows_small, rows_big) and bytes_big > 14 * bytes_small
    # 15x the data; the peak may differ by allocator noise, not by the file (a reader that held
    # the file would add >= 240 MB to a ~100 MB baseline).
    assert rss_big < 1.2 * rss_small, (rss_small, rss_big)
