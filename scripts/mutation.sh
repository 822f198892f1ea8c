#!/usr/bin/env bash
# Mutation testing of the modules that carry the losslessness guarantee (the list, the tests it runs and their
# options: [tool.mutmut] in pyproject.toml), then the score per module. Not part of CI: it takes tens of minutes on
# 2 cores. `JOBS=4 scripts/mutation.sh` runs more mutants at once; `mutmut show NAME` prints one mutant's diff and
# `mutmut results` lists the survivors (CONTRIBUTING.md, "Mutation testing", explains the equivalent ones).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf mutants  # mutmut keeps its state there; start from the working tree as it is now
# mutmut forks a child per mutant from a process that has run torch: with OpenMP's thread pool started, a forked
# child can wait forever on threads it does not have (mutants then "time out" idle). One thread each avoids it.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
.venv/bin/mutmut run --max-children "${JOBS:-2}" >mutation.log 2>&1 || { tail -c 2000 mutation.log; exit 1; }
.venv/bin/python - <<'PY'
import json, pathlib
from mutmut.stats import status_by_exit_code

print(f"{'module':32} {'mutants':>7} {'killed':>6} {'survived':>8} {'no tests':>8} {'timeout':>7} {'score':>6}")
for meta in sorted(pathlib.Path("mutants/src").rglob("*.py.meta")):
    codes = json.loads(meta.read_text())["exit_code_by_key"].values()
    status = [status_by_exit_code[c] for c in codes]
    n = {s: status.count(s) for s in ("killed", "survived", "no tests", "timeout")}
    tested = len(status) - n["no tests"]
    score = (n["killed"] + n["timeout"]) / tested if tested else 0.0
    name = str(meta.relative_to("mutants/src")).removesuffix(".meta")
    print(f"{name:32} {len(status):7} {n['killed']:6} {n['survived']:8} {n['no tests']:8} {n['timeout']:7} {score:6.1%}")
PY
